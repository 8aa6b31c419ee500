package bench

import (
	"github.com/tether-project/tether/worker/adp"
	"strings"
	"slices"
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

func TestTryAll(t *testing.T) {
	if os.Getenv("BENCH_TRY") == "" {
		t.Skip()
	}
	t0 := time.Now()
	w, err := LoadTraces("/work/shared/traces/kv-cache-tester", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("load", time.Since(t0), w.Stats(), "UB", UpperBound(w))
	base := DefaultSimConfig()
	base.Log = LogKind(os.Getenv("BENCH_LOG"))
	if base.Log == "" { base.Log = LogSequencer }
	if c := os.Getenv("BENCH_CAP"); c != "" { fmt.Sscan(c, &base.CapacityBlocks) }
	if c := os.Getenv("BENCH_RANKS"); c != "" { fmt.Sscan(c, &base.Ranks) }
	if c := os.Getenv("BENCH_TS"); c != "" { fmt.Sscan(c, &base.TimeScale) }
	if c := os.Getenv("BENCH_ADP"); c != "" { p, err := adp.ParsePlacement(c); if err != nil { t.Fatal(err) }; base.ADPPlacement = p }
	pols, _ := ParsePolicies(os.Getenv("BENCH_POL"))
	rep, err := Replay(context.Background(), w, ReplayOptions{Base: base, Policies: pols, Edges: edgesFromEnv()})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Policies {
		fmt.Printf("%-14s e=%d hit=%.3f sub=%.3f prefillTok=%d p50=%.0f p99=%.0f cov=%.3f ovf=%d reb=%d rankovf=%d shed=%d over=%d commits=%d wall=%.0fms\n",
			s.Name, s.Edges, s.HitRate, s.SubagentHitRate, s.PrefillTokens, s.TTFTP50Ms, s.TTFTP99Ms, s.LoadCoV, s.Overflows, s.Rebinds, s.RankOverflows, s.Shed, s.Oversized, s.Commits, s.WallMs)
	}
	fmt.Println("total", time.Since(t0))
}

func TestTrySub(t *testing.T) {
	if os.Getenv("BENCH_SUB") == "" {
		t.Skip()
	}
	w, err := LoadTraces("/work/shared/traces/kv-cache-tester", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	base := DefaultSimConfig()
	base.Log = LogSequencer
	pols, _ := ParsePolicies(os.Getenv("BENCH_POL"))
	rep, err := Replay(context.Background(), w, ReplayOptions{Base: base, Policies: pols, Edges: []int{3}, KeepRecords: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Runs {
		var byCall [4][2]int64
		var parentInst = map[string]int{}
		for _, rec := range r.Records {
			if !rec.SubAgent { parentInst[rec.Agent] = rec.Instance }
		}
		same, diff := 0, 0
		for _, rec := range r.Records {
			if !rec.SubAgent || rec.Oversized { continue }
			c := min(rec.Call, 3)
			byCall[c][0] += int64(rec.Prompt); byCall[c][1] += int64(rec.Cached)
			root := rec.Agent[:10]
			if parentInst[root] == rec.Instance { same++ } else { diff++ }
		}
		fmt.Printf("%-14s", r.Policy)
		for c := 0; c < 4; c++ { fmt.Printf(" call%d=%.3f(%dk)", c, float64(byCall[c][1])/float64(byCall[c][0]), byCall[c][0]/1000) }
		fmt.Printf(" sameInstAsParentLast=%d diff=%d\n", same, diff)
	}
}

func TestTryEvict(t *testing.T) {
	if os.Getenv("BENCH_EV") == "" {
		t.Skip()
	}
	w, err := LoadTraces("/work/shared/traces/kv-cache-tester", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// shared prefix of each request with the same agent's previous request
	prevShare := map[string][]int{}
	w.Walk(func(a *Agent) {
		var prev []uint64
		for _, s := range a.Steps {
			if s.Request == nil { continue }
			n := 0
			for n < len(prev) && n < len(s.Request.Blocks) && prev[n] == s.Request.Blocks[n] { n++ }
			prevShare[a.ID] = append(prevShare[a.ID], n)
			prev = s.Request.Blocks
		}
	})
	base := DefaultSimConfig()
	base.Log = LogSequencer
	pols, _ := ParsePolicies(os.Getenv("BENCH_POL"))
	rep, err := Replay(context.Background(), w, ReplayOptions{Base: base, Policies: pols, Edges: []int{3}, KeepRecords: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Runs {
		for _, sub := range []bool{false, true} {
			var exp, got, lostReq, moved, n int64
			lastInst := map[string]int{}
			for _, rec := range r.Records {
				if rec.SubAgent != sub || rec.Oversized || rec.Call == 0 { lastInst[rec.Agent] = rec.Instance; continue }
				e := int64(prevShare[rec.Agent][rec.Call]) * 64
				e = min(e, int64(rec.Prompt))
				exp += e; got += min(int64(rec.Cached), e); n++
				if int64(rec.Cached) < e { lostReq++ }
				if lastInst[rec.Agent] != rec.Instance { moved++ }
				lastInst[rec.Agent] = rec.Instance
			}
			fmt.Printf("%-14s sub=%v n=%d expectedFromPrev=%dk got=%dk (%.3f) reqsLosing=%d moved=%d\n", r.Policy, sub, n, exp/1000, got/1000, float64(got)/float64(exp), lostReq, moved)
		}
	}
}

func TestTryCov(t *testing.T) {
	if os.Getenv("BENCH_COV") == "" {
		t.Skip()
	}
	w, err := LoadTraces("/work/shared/traces/kv-cache-tester", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	base := DefaultSimConfig()
	base.Log = LogSequencer
	pols, _ := ParsePolicies(os.Getenv("BENCH_POL"))
	rep, err := Replay(context.Background(), w, ReplayOptions{Base: base, Policies: pols, Edges: []int{3}, KeepRecords: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Runs {
		fam := map[string]int64{}
		perInst := map[string]map[int]bool{}
		for _, rec := range r.Records {
			root := rec.Agent[:10]
			fam[root] += int64(rec.Prompt - rec.Cached)
			if perInst[root] == nil { perInst[root] = map[int]bool{} }
			perInst[root][rec.Instance] = true
		}
		var ws []int64
		var tot int64
		for _, v := range fam { ws = append(ws, v); tot += v }
		slices.Sort(ws); slices.Reverse(ws)
		bins := make([]int64, 8)
		for _, x := range ws { i := 0; for j := range bins { if bins[j] < bins[i] { i = j } }; bins[i] += x }
		fmt.Printf("%s: actual cov=%.3f perInst=%v; LPT-optimal sticky cov=%.3f bins=%v; top5 conv share=%v of %d\n", r.Policy, CoV(r.InstancePrefillTokens), r.InstancePrefillTokens, CoV(bins), bins, ws[:5], tot)
	}
}

func edgesFromEnv() []int {
	s := os.Getenv("BENCH_EDGES")
	if s == "" { return []int{3} }
	var out []int
	for _, f := range strings.Split(s, ",") { var n int; fmt.Sscan(f, &n); out = append(out, n) }
	return out
}

func TestTryDbg(t *testing.T) {
	if os.Getenv("BENCH_DBG") == "" {
		t.Skip()
	}
	w, err := LoadTraces("/work/shared/traces/kv-cache-tester", TraceOptions{MaxDuration: 1000 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultSimConfig()
	cfg.Log = LogSequencer
	cfg.Instances, cfg.CapacityBlocks = 4, 4500
	for _, p := range []Policy{PolicySession, PolicyPrefix} {
		cfg.Policy = p
		r, err := Simulate(context.Background(), w, cfg)
		if err != nil { t.Fatal(err) }
		fmt.Println(p, r.InstancePrefillTokens)
		per := map[string][]int{}
		var order []string
		for _, rec := range r.Records {
			if per[rec.Agent] == nil { order = append(order, rec.Agent) }
			per[rec.Agent] = append(per[rec.Agent], rec.Instance)
		}
		for _, a := range order { fmt.Println("  ", a, per[a]) }
	}
}

func TestTryOvf(t *testing.T) {
	if os.Getenv("BENCH_OVF") == "" {
		t.Skip()
	}
	full, err := LoadTraces("/work/shared/traces/kv-cache-tester", TraceOptions{})
	if err != nil { t.Fatal(err) }
	short, err := LoadTraces("/work/shared/traces/kv-cache-tester", TraceOptions{MaxDuration: 1000 * time.Second})
	if err != nil { t.Fatal(err) }
	for _, setup := range []struct{ name string; w *Workload; inst, c int }{{"short", short, 4, 4500}, {"full", full, 8, 6000}} {
		for _, q := range []int{8, 4, 2, 1} {
			for _, rb := range []time.Duration{30 * time.Second, 5 * time.Second} {
				cfg := DefaultSimConfig()
				cfg.Log = LogSequencer
				cfg.Instances, cfg.CapacityBlocks = setup.inst, setup.c
				cfg.Policy = PolicyTether
				cfg.Routing.Overflow.QueuedRequests = q
				cfg.Routing.Overflow.RebindAfter = rb
				r, err := Simulate(context.Background(), setup.w, cfg)
				if err != nil { t.Fatal(err) }
				s := Summarize(r)
				fmt.Printf("%s q=%d rebind=%v: hit=%.3f sub=%.3f ovf=%d reb=%d p50=%.0f p99=%.0f cov=%.3f\n", setup.name, q, rb, s.HitRate, s.SubagentHitRate, s.Overflows, s.Rebinds, s.TTFTP50Ms, s.TTFTP99Ms, s.LoadCoV)
			}
		}
	}
}

func TestTryCommits(t *testing.T) {
	if os.Getenv("BENCH_CM") == "" {
		t.Skip()
	}
	w, err := LoadTraces("/work/shared/traces/kv-cache-tester", TraceOptions{})
	if err != nil { t.Fatal(err) }
	for _, p := range []Policy{PolicyTether, PolicyTetherCacheRebind} {
		cfg := DefaultSimConfig()
		cfg.Log = LogSequencer
		cfg.Policy = p
		s, err := newSimulator(context.Background(), w, cfg)
		if err != nil { t.Fatal(err) }
		if err := s.run(context.Background()); err != nil { t.Fatal(err) }
		c := s.log.State(0).Counters()
		fmt.Printf("%s commits=%d binds=%d links=%d rebinds=%d overflows=%v touched=%d\n", p, s.res.Commits, c.BindsCreated, c.LinksCreated, c.Rebinds, c.Overflows, c.Touched)
	}
}
