package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// EngineWork is what engines report of the prompt tokens they received:
// computed (prefill work), found in their own prefix cache, or received
// from another engine (a prefill/decode split's KV transfer). It is read
// from the engines' /metrics: vLLM's
// vllm:prompt_tokens_by_source_total{source="local_compute" |
// "local_cache_hit" | "external_kv_transfer"}, summed over engine cores
// and servers. A run's work is the difference of two scrapes.
type EngineWork struct {
	Computed    float64 `json:"computed_prompt_tokens"`
	CacheHit    float64 `json:"cached_prompt_tokens"`
	Transferred float64 `json:"transferred_prompt_tokens"`
	Engines     int     `json:"engines"`
	// Requests and PromptTokens are the run's (Per* divide by them).
	Requests     int   `json:"requests"`
	PromptTokens int64 `json:"prompt_tokens"`
}

// promptSourceFamily is vLLM's counter of prompt tokens by source.
const promptSourceFamily = "vllm:prompt_tokens_by_source_total"

// ScrapeEngineWork reads every engine's counters.
func ScrapeEngineWork(ctx context.Context, c *http.Client, urls []string) (EngineWork, error) {
	var w EngineWork
	var errs []error
	for _, u := range urls {
		got, err := scrapeSources(ctx, c, u)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", u, err))
			continue
		}
		w.Computed += got["local_compute"]
		w.CacheHit += got["local_cache_hit"]
		w.Transferred += got["external_kv_transfer"]
		w.Engines++
	}
	return w, errors.Join(errs...)
}

func scrapeSources(ctx context.Context, c *http.Client, u string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("not the Prometheus text format: %w", err)
	}
	fam, ok := fams[promptSourceFamily]
	if !ok {
		return nil, fmt.Errorf("no %s (not a vLLM /metrics?)", promptSourceFamily)
	}
	out := map[string]float64{}
	for _, m := range fam.GetMetric() {
		out[label(m, "source")] += value(m)
	}
	return out, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	}
	return 0
}

// Since is the work done between before and w, for the run r.
func (w EngineWork) Since(before EngineWork, r *RunResult) EngineWork {
	out := EngineWork{Computed: w.Computed - before.Computed, CacheHit: w.CacheHit - before.CacheHit,
		Transferred: w.Transferred - before.Transferred, Engines: w.Engines}
	if r != nil {
		out.Requests = len(r.Records)
		for _, rec := range r.Records {
			out.PromptTokens += int64(rec.Prompt)
		}
	}
	return out
}

// WriteText prints the work per request and as a share of the prompts.
func (w EngineWork) WriteText(out io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "engine prompt tokens (%d engines, %d requests, %d prompt tokens sent):\n", w.Engines, w.Requests, w.PromptTokens)
	per := func(v float64) string {
		if w.Requests == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", v/float64(w.Requests))
	}
	share := func(v float64) string {
		if w.PromptTokens == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", v/float64(w.PromptTokens))
	}
	fmt.Fprintf(&b, "  %-24s %14s %12s %14s\n", "source", "tokens", "per request", "per prompt token")
	for _, row := range []struct {
		name string
		v    float64
	}{{"computed (prefill work)", w.Computed}, {"engine prefix cache", w.CacheHit}, {"KV transfer", w.Transferred}} {
		fmt.Fprintf(&b, "  %-24s %14.0f %12s %14s\n", row.name, row.v, per(row.v), share(row.v))
	}
	_, err := io.WriteString(out, b.String())
	return err
}
