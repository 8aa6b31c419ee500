package bench

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteText prints the comparison as a table.
func (r *Report) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "upper bound (one infinite cache): hit rate %.3f\n", r.UpperBound)
	if r.PooledBound > 0 {
		fmt.Fprintf(w, "without prompts larger than a rank's cache: infinite cache %.3f, pooled cache of the fleet's capacity %.3f\n",
			r.FittingBound, r.PooledBound)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tedges\thit rate\tsub-agent hit\tprefill tokens\tbusiest inst M\tTTFT p50 ms\tp90 ms\tp99 ms\tmakespan s\tutil\toverflows\trebinds\tcommits\tshed\t")
	for _, p := range r.Policies {
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%d\t%.1f\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f\t%d\t%d\t%d\t%d\t\n", p.Name, p.Edges, p.HitRate, p.SubagentHitRate,
			p.PrefillTokens, float64(p.MaxInstancePrefillTokens)/1e6, p.TTFTP50Ms, p.TTFTP90Ms, p.TTFTP99Ms, p.MakespanMs/1000, p.Utilisation,
			p.Overflows, p.Rebinds, p.Commits, p.Shed)
	}
	return tw.Flush()
}

// Describe prints a workload's and a configuration's key figures.
func Describe(w io.Writer, wl *Workload, cfg SimConfig) {
	st := wl.Stats()
	fmt.Fprintf(w, "workload %s: %d conversations, %d sub-agents, %d requests (%d by sub-agents), %d prompt tokens, %d blocks (largest prompt %d blocks)\n",
		wl.Name, st.Conversations, st.SubAgents, st.Requests, st.SubRequests, st.PromptTokens, st.Blocks, st.MaxBlocks)
	fmt.Fprintf(w, "fleet: %d instances × %d ranks, %d KV blocks per instance (%d per rank), time scale %g, seed %d, affinity log %s\n",
		cfg.Instances, cfg.Ranks, cfg.CapacityBlocks, cfg.CapacityBlocks/max(cfg.Ranks, 1), cfg.TimeScale, cfg.Seed, cfg.Log)
}
