package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tether-project/tether/ops/bench"
)

// run is one bench replay --json file.
type runFile struct {
	Policies   []bench.Summary   `json:"policies"`
	EngineWork *bench.EngineWork `json:"engine_work"`
}

var setupOrder = []string{"split", "aggregated", "emulated"}

var setupNames = map[string]string{
	"split":      "prefill/decode split (edges drive the NixlConnector handoff)",
	"aggregated": "aggregated (the same servers, whole requests)",
	"emulated":   "emulated disaggregation (tether worker proxies: one token, then the whole prompt again)",
}

// summary prints, per setup, the medians and ranges over the seeds of the
// prefill work per request and per prompt token and of the hit rate.
func summary(out io.Writer, files []string) error {
	type figures struct{ perRequest, perToken, hit, transferred []float64 }
	by := map[string]*figures{}
	requests := map[string]int{}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		parts := strings.Split(name, "-")
		if len(parts) < 3 {
			return fmt.Errorf("%s: want pdbench-<setup>-<seed>.json", f)
		}
		setup := parts[1]
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var r runFile
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if r.EngineWork == nil || len(r.Policies) != 1 || r.EngineWork.Requests == 0 || r.EngineWork.PromptTokens == 0 {
			return fmt.Errorf("%s: no engine work (run with --engine-metrics)", f)
		}
		w := r.EngineWork
		fg := by[setup]
		if fg == nil {
			fg = &figures{}
			by[setup] = fg
		}
		fg.perRequest = append(fg.perRequest, w.Computed/float64(w.Requests))
		fg.perToken = append(fg.perToken, w.Computed/float64(w.PromptTokens))
		fg.transferred = append(fg.transferred, w.Transferred/float64(w.PromptTokens))
		fg.hit = append(fg.hit, r.Policies[0].HitRate)
		requests[setup] = w.Requests
	}
	cell := func(v []float64, format string) string {
		s := slices.Clone(v)
		slices.Sort(s)
		med := s[len(s)/2]
		if len(s)%2 == 0 {
			med = (s[len(s)/2-1] + s[len(s)/2]) / 2
		}
		return fmt.Sprintf(format+" ("+format+"–"+format+")", med, s[0], s[len(s)-1])
	}
	fmt.Fprintln(out, "| setup | seeds | requests | prompt tokens computed per request | per prompt token sent | KV received per prompt token | client hit rate |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|")
	for _, setup := range setupOrder {
		fg := by[setup]
		if fg == nil {
			continue
		}
		fmt.Fprintf(out, "| %s | %d | %d | %s | %s | %s | %s |\n", setupNames[setup], len(fg.perRequest), requests[setup],
			cell(fg.perRequest, "%.0f"), cell(fg.perToken, "%.3f"), cell(fg.transferred, "%.3f"), cell(fg.hit, "%.3f"))
	}
	return nil
}
