package fleetview

import (
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/tether-project/tether/internal/enginemetrics"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/routing"
)

// LoRAState is what an engine says of its LoRA adapters: a tether worker's
// load report, or vLLM's vllm:lora_requests_info.
type LoRAState struct {
	MaxLoRAs int
	// Loaded: held or being loaded (any rank), sorted.
	Loaded []string
	// Full: on every rank each slot holds an adapter with running
	// requests.
	Full bool
}

// loraFromReport is a load report's adapters (nil: it reports none).
func loraFromReport(r *telemetry.LoadReport) *LoRAState {
	if r.MaxLoRAs == 0 {
		return nil
	}
	st := &LoRAState{MaxLoRAs: r.MaxLoRAs, Full: len(r.Ranks) > 0}
	for _, rk := range r.Ranks {
		st.Loaded = append(st.Loaded, rk.LoRAAdapters...)
		if len(rk.LoRARunning) < r.MaxLoRAs {
			st.Full = false
		}
	}
	st.Loaded = sortedUnique(st.Loaded)
	return st
}

// MetricVLLMLoRA is vLLM's LoRA gauge (vllm/v1/metrics/loggers.py): one
// series per label set, set to the time it was last current; labels
// max_lora, running_lora_adapters and waiting_lora_adapters (adapter names
// joined by commas). The Gateway API Inference Extension's model server
// protocol reads the same metric.
const MetricVLLMLoRA = "vllm:lora_requests_info"

// ParseLoRAMetrics reads vLLM's LoRA gauge from a Prometheus text
// exposition (internal/enginemetrics parses it); see LoRAFromFamilies.
func ParseLoRAMetrics(r io.Reader) (*LoRAState, error) {
	fams, err := enginemetrics.Families(r)
	if err != nil {
		return nil, err
	}
	return LoRAFromFamilies(fams), nil
}

// LoRAFromFamilies reads vLLM's LoRA gauge from parsed metric families:
// the series with the newest timestamp (its value) is the engine's current
// state. Adapters running or waiting count as loaded (a waiting adapter is
// loaded before its requests run); the instance is full when running
// adapters fill max_lora. nil: the exposition has no such series (LoRA is
// off, or another engine).
func LoRAFromFamilies(fams map[string]*dto.MetricFamily) *LoRAState {
	fam := fams[MetricVLLMLoRA]
	if fam == nil {
		return nil
	}
	var best *dto.Metric
	bestValue := 0.0
	for _, m := range fam.GetMetric() {
		if v := enginemetrics.Value(m); best == nil || v > bestValue {
			best, bestValue = m, v
		}
	}
	if best == nil {
		return nil
	}
	slots := enginemetrics.Label(best, "max_lora")
	if slots == "" {
		slots = enginemetrics.Label(best, "max_loras")
	}
	n, _ := strconv.Atoi(strings.TrimSpace(slots))
	running := splitAdapters(enginemetrics.Label(best, "running_lora_adapters"))
	st := &LoRAState{MaxLoRAs: min(max(n, 0), telemetry.MaxLoRAs)}
	st.Loaded = sortedUnique(append(running, splitAdapters(enginemetrics.Label(best, "waiting_lora_adapters"))...))
	st.Full = st.MaxLoRAs > 0 && len(running) >= st.MaxLoRAs
	return st
}

func splitAdapters(v string) []string {
	var out []string
	for _, a := range strings.Split(v, ",") {
		if a = strings.TrimSpace(a); a != "" && len(out) < telemetry.MaxLoRAs {
			out = append(out, a)
		}
	}
	return out
}

func sortedUnique(s []string) []string {
	sort.Strings(s)
	return slices.Compact(s)
}

// NoteAdapter records that this edge sent a request for adapter to
// instance id: until the predictions expire (Config.PredictTTL) the
// instance counts as holding it, so a burst for one adapter lands where
// the first request made the engine load it, before the engine's own
// report says so (as the KV index's predictions do for prompts).
func (f *View) NoteAdapter(id, adapter string, now time.Time) {
	if adapter == "" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	in, ok := f.byID[id]
	if !ok {
		return
	}
	if in.loraSent == nil {
		in.loraSent = map[string]time.Time{}
	}
	in.loraSent[adapter] = now
	// Bounded: an instance holds few adapters; the oldest go first.
	for len(in.loraSent) > telemetry.MaxLoRAs {
		oldest, at := "", now
		for a, t := range in.loraSent {
			if t.Before(at) || oldest == "" {
				oldest, at = a, t
			}
		}
		delete(in.loraSent, oldest)
	}
}

// loraViewLocked is the instance's adapters as routing sees them: the
// engine's report merged with this edge's recent requests (nil when
// neither says anything). Under f.mu (read).
func (f *View) loraViewLocked(in *instance, now time.Time) *routing.LoRAView {
	ttl := f.cfg.PredictTTL
	if ttl <= 0 {
		ttl = 5 * time.Second
	}
	var sent []string
	for a, t := range in.loraSent {
		if now.Sub(t) < ttl {
			sent = append(sent, a)
		}
	}
	if in.lora == nil && len(sent) == 0 {
		return nil
	}
	v := &routing.LoRAView{}
	if in.lora != nil {
		v.MaxLoRAs, v.Full = in.lora.MaxLoRAs, in.lora.Full
		v.Loaded = append(v.Loaded, in.lora.Loaded...)
	}
	if v.MaxLoRAs == 0 {
		v.MaxLoRAs = in.maxLoRAs // the configured slots of an engine that reports none
	}
	if in.lora == nil && v.MaxLoRAs > 0 && len(sent) >= v.MaxLoRAs {
		// Known only from this edge's own requests: the adapters it sent
		// lately fill the slots, so another one waits for one of them.
		v.Full = true
	}
	v.Loaded = sortedUnique(append(v.Loaded, sent...))
	return v
}
