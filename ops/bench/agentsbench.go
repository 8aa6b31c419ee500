package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"text/tabwriter"
)

// AgentSummary is one policy's figures on a synthetic pattern.
type AgentSummary struct {
	Name      string  `json:"name"`
	Edges     int     `json:"edges"`
	Calls     int     `json:"calls"`
	PrefillMs float64 `json:"prefill_ms"` // summed prefill compute time over every call
	HitRate   float64 `json:"hit_rate"`
	TTFTP50Ms float64 `json:"ttft_p50_ms"`
	TTFTP99Ms float64 `json:"ttft_p99_ms"`
	// Reduction is 1 − PrefillMs / round robin's PrefillMs.
	Reduction float64 `json:"reduction_vs_round_robin"`
	// FirstCallHitRate: hit rate of every agent's first call.
	FirstCallHitRate float64 `json:"first_call_hit_rate"`
	// SubagentFirstCallHitRate: hit rate of the sub-agents' first calls
	// (supervisor: the workers sharing the common tool prefix).
	SubagentFirstCallHitRate float64 `json:"subagent_first_call_hit_rate"`
	Commits                  int     `json:"commits"`
}

// AgentsReport is a pattern's comparison.
type AgentsReport struct {
	Mode     string         `json:"mode"`
	Pattern  Pattern        `json:"pattern"`
	Agents   int            `json:"agents"`
	Requests int            `json:"requests"`
	Policies []AgentSummary `json:"policies"`
	// Spec figures, for the react pattern.
	SpecRandomMs     float64 `json:"spec_random_ms,omitempty"`
	SpecCacheAwareMs float64 `json:"spec_cache_aware_ms,omitempty"`
}

// RunAgents replays a pattern's workload under every policy in sim mode.
func RunAgents(ctx context.Context, opts AgentOptions, ro ReplayOptions) (*AgentsReport, error) {
	w, err := Agents(opts)
	if err != nil {
		return nil, err
	}
	ro.KeepRecords = true
	rep, err := Replay(ctx, w, ro)
	if err != nil {
		return nil, err
	}
	return SummarizeAgents(opts.Pattern, w, "sim", rep.Runs), nil
}

// SummarizeAgents computes the pattern figures of runs (with records).
func SummarizeAgents(p Pattern, w *Workload, mode string, runs []*RunResult) *AgentsReport {
	st := w.Stats()
	out := &AgentsReport{Mode: mode, Pattern: p, Agents: st.Conversations + st.SubAgents, Requests: st.Requests}
	if p == PatternReAct {
		out.SpecRandomMs, out.SpecCacheAwareMs = SpecReAct.RandomMs, SpecReAct.CacheAwareMs
	}
	rr := map[int]float64{} // edges → round robin prefill ms
	for _, r := range runs {
		s := Summarize(r)
		a := AgentSummary{Name: s.Name, Edges: s.Edges, Calls: s.Requests, PrefillMs: s.PrefillMs, HitRate: s.HitRate,
			TTFTP50Ms: s.TTFTP50Ms, TTFTP99Ms: s.TTFTP99Ms, Commits: s.Commits}
		var fp, fc, sp, sc int64
		for _, rec := range r.Records {
			if rec.Call != 0 {
				continue
			}
			fp += int64(rec.Prompt)
			fc += int64(rec.Cached)
			if rec.SubAgent {
				sp += int64(rec.Prompt)
				sc += int64(rec.Cached)
			}
		}
		a.FirstCallHitRate = ratio(fc, fp)
		a.SubagentFirstCallHitRate = ratio(sc, sp)
		if r.Policy == PolicyRoundRobin {
			rr[r.Edges] = a.PrefillMs
		}
		out.Policies = append(out.Policies, a)
	}
	for i := range out.Policies {
		if base, ok := rr[out.Policies[i].Edges]; ok && base > 0 {
			out.Policies[i].Reduction = 1 - out.Policies[i].PrefillMs/base
		}
	}
	return out
}

// WriteText prints the pattern comparison as a table.
func (r *AgentsReport) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "pattern %s (%s mode): %s, %d calls\n", r.Pattern, r.Mode, plural(r.Agents, "agent"), r.Requests)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tedges\tprefill ms\tvs round robin\thit rate\tfirst-call hit\tsub-agent first-call hit\tTTFT p50 ms\tTTFT p99 ms\t")
	for _, p := range r.Policies {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%.3f\t%.3f\t%.3f\t%.0f\t%.0f\t\n", p.Name, p.Edges, p.PrefillMs, pct(-p.Reduction),
			p.HitRate, p.FirstCallHitRate, p.SubagentFirstCallHitRate, p.TTFTP50Ms, p.TTFTP99Ms)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.SpecRandomMs > 0 {
		fmt.Fprintf(w, "spec (seed 003): random %.0f ms, cache-aware %.0f ms of prefill (%s)\n",
			r.SpecRandomMs, r.SpecCacheAwareMs, pct(r.SpecCacheAwareMs/r.SpecRandomMs-1))
	}
	return nil
}

// pct formats a signed fraction as a percentage.
func pct(x float64) string {
	if math.Abs(x) < 0.0005 {
		return "0.0%"
	}
	return fmt.Sprintf("%+.1f%%", 100*x)
}
