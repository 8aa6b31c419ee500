package bench

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/tether-project/tether/worker/kvcache"
)

// Summary is one run's figures, as --json prints them.
type Summary struct {
	Name            string  `json:"name"`
	Edges           int     `json:"edges"`
	HitRate         float64 `json:"hit_rate"`
	SubagentHitRate float64 `json:"subagent_hit_rate"`
	PrefillTokens   int64   `json:"prefill_tokens"`
	TTFTP50Ms       float64 `json:"ttft_p50_ms"`
	TTFTP90Ms       float64 `json:"ttft_p90_ms"`
	TTFTP95Ms       float64 `json:"ttft_p95_ms"`
	TTFTP99Ms       float64 `json:"ttft_p99_ms"`
	// MakespanMs: first arrival to the last response's end.
	MakespanMs float64 `json:"makespan_ms"`
	// Utilisation: prefill compute time over (instances × makespan).
	Utilisation float64 `json:"utilisation"`
	LoadCoV     float64 `json:"load_cov"`
	Overflows   int     `json:"overflows"`
	Commits     int     `json:"commits"`

	// Beyond the documented fields.
	Requests      int     `json:"requests"`
	PromptTokens  int64   `json:"prompt_tokens"`
	PrefillMs     float64 `json:"prefill_ms"` // summed prefill compute time
	Rebinds       int     `json:"rebinds"`
	RankOverflows int     `json:"rank_overflows"`
	Shed          int     `json:"shed"`
	Oversized     int     `json:"oversized"`
	LocalWrites   int     `json:"local_writes,omitempty"`
	TTLEvictions  int     `json:"ttl_evictions"`
	LostBinds     int     `json:"lost_binds"`
	// SubagentFirstCallHitRate: sub-agents' first requests only (their
	// shared prefix with siblings).
	SubagentFirstCallHitRate float64 `json:"subagent_first_call_hit_rate"`
	// MaxInstancePrefillTokens: the busiest instance's computed prompt
	// tokens (the hot spot; CoV is relative to the mean).
	MaxInstancePrefillTokens int64   `json:"max_instance_prefill_tokens"`
	WallMs                   float64 `json:"wall_ms"`
	// Reuse: the prompt tokens by what their cache held between a
	// conversation's turns (sim runs).
	Reuse *Reuse `json:"reuse,omitempty"`

	hitLo, hitHi float64 // range over seeds (reports)
}

// Summarize computes a run's figures.
func Summarize(r *RunResult) Summary {
	s := Summary{Name: string(r.Policy), Edges: r.Edges, Overflows: r.Overflows, Commits: r.Commits,
		Rebinds: r.Rebinds, RankOverflows: r.RankOverflows, Shed: r.Shed, LocalWrites: r.LocalWrites, TTLEvictions: r.TTLEvictions, LostBinds: r.LostBinds,
		Requests: len(r.Records), WallMs: ms(r.Wall)}
	var cached, subPrompt, subCached, firstPrompt, firstCached int64
	ttfts := make([]time.Duration, 0, len(r.Records))
	var prefill time.Duration
	for _, rec := range r.Records {
		s.PromptTokens += int64(rec.Prompt)
		cached += int64(rec.Cached)
		if rec.SubAgent {
			subPrompt += int64(rec.Prompt)
			subCached += int64(rec.Cached)
			if rec.Call == 0 {
				firstPrompt += int64(rec.Prompt)
				firstCached += int64(rec.Cached)
			}
		}
		if rec.Oversized {
			s.Oversized++
		}
		ttfts = append(ttfts, rec.TTFT)
		prefill += rec.Prefill
	}
	s.HitRate = ratio(cached, s.PromptTokens)
	s.SubagentHitRate = ratio(subCached, subPrompt)
	s.PrefillTokens = s.PromptTokens - cached
	s.PrefillMs = ms(prefill)
	slices.Sort(ttfts)
	s.TTFTP50Ms = ms(Percentile(ttfts, 0.50))
	s.TTFTP90Ms = ms(Percentile(ttfts, 0.90))
	s.TTFTP95Ms = ms(Percentile(ttfts, 0.95))
	s.TTFTP99Ms = ms(Percentile(ttfts, 0.99))
	s.MakespanMs = ms(r.Makespan)
	if n := len(r.InstancePrefillTokens); n > 0 && r.Makespan > 0 {
		s.Utilisation = float64(prefill) / (float64(n) * float64(r.Makespan))
	}
	s.LoadCoV = CoV(r.InstancePrefillTokens)
	s.SubagentFirstCallHitRate = ratio(firstCached, firstPrompt)
	for _, t := range r.InstancePrefillTokens {
		s.MaxInstancePrefillTokens = max(s.MaxInstancePrefillTokens, t)
	}
	s.Reuse = ReuseOf(r.Records, r.RankCapacityTokens)
	return s
}

// StickyBalanceBound is the load CoV of a hindsight packing heuristic, not a
// bound: each root conversation (with its sub-agents) is one indivisible job
// weighing the prefill tokens it computed in run r, packed onto instances
// largest first (LPT, a greedy heuristic within 4/3 of the optimal
// makespan). It shows how even a sticky placement of these jobs could be
// with hindsight; an optimal packing may be more even.
func StickyBalanceBound(r *RunResult, instances int) float64 {
	if instances < 1 {
		return 0
	}
	jobs := map[string]int64{}
	for _, rec := range r.Records {
		jobs[rec.Root] += int64(rec.Prompt - rec.Cached)
	}
	ws := make([]int64, 0, len(jobs))
	for _, w := range jobs {
		ws = append(ws, w)
	}
	slices.Sort(ws)
	slices.Reverse(ws)
	bins := make([]int64, instances)
	for _, w := range ws {
		i := 0
		for j := range bins {
			if bins[j] < bins[i] {
				i = j
			}
		}
		bins[i] += w
	}
	return CoV(bins)
}

// Percentile is the nearest-rank percentile of sorted durations (0 for none).
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// CoV is the coefficient of variation (population standard deviation over
// the mean) of xs; 0 when the mean is 0.
func CoV(xs []int64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var sum float64
	for _, x := range xs {
		sum += float64(x)
	}
	mean := sum / float64(len(xs))
	if mean == 0 {
		return 0
	}
	var ss float64
	for _, x := range xs {
		d := float64(x) - mean
		ss += d * d
	}
	return math.Sqrt(ss/float64(len(xs))) / mean
}

// UpperBound is the hit rate of one infinite cache shared by every request:
// each request hits the leading blocks that any request stored before it.
// With chained block hashes every distinct block misses exactly once, so
// the figure does not depend on the order in which requests ran, and no
// policy (finite caches, any placement) can beat it.
func UpperBound(w *Workload) float64 { return UpperBoundFitting(w, math.MaxInt) }

// UpperBoundFitting is UpperBound crediting nothing to prompts longer than
// maxBlocks (an instance's, or a rank's, cache): no placement can cache
// them, so neither bound credits them (they still count as prompt tokens).
func UpperBoundFitting(w *Workload, maxBlocks int) float64 {
	seen := map[uint64]struct{}{}
	var prompt, hit int64
	w.WalkRequests(func(_ *Agent, r *Request) {
		prompt += int64(r.PromptTokens)
		if len(r.Blocks) > maxBlocks {
			return
		}
		n := 0
		for n < len(r.Blocks) {
			if _, ok := seen[r.Blocks[n]]; !ok {
				break
			}
			n++
		}
		for _, b := range r.Blocks[n:] {
			seen[b] = struct{}{}
		}
		hit += int64(min(n*w.BlockSize, r.PromptTokens))
	})
	return ratio(hit, prompt)
}

// PooledBound is the capacity-aware reference: one cache of totalBlocks
// (the fleet's total capacity) with the workers' eviction (worker/kvcache,
// LRU of unreferenced blocks), serving every request in the order run r
// admitted them, one at a time. It is perfect routing without
// fragmentation: no placement can find more of the fleet's cache than one
// pool holds. Prompts longer than maxBlocks (one instance's cache) are
// credited nothing and not stored, as in UpperBoundFitting.
func PooledBound(w *Workload, r *RunResult, totalBlocks, maxBlocks int) float64 {
	calls := map[string][]*Request{}
	w.WalkRequests(func(a *Agent, q *Request) { calls[a.ID] = append(calls[a.ID], q) })
	order := slices.Clone(r.Records)
	slices.SortStableFunc(order, func(a, b RequestRecord) int { return cmp.Compare(a.Admitted, b.Admitted) })
	c := kvcache.New(totalBlocks)
	var prompt, hit int64
	for _, rec := range order {
		qs := calls[rec.Agent]
		if rec.Call >= len(qs) {
			continue
		}
		q := qs[rec.Call]
		prompt += int64(q.PromptTokens)
		if len(q.Blocks) > maxBlocks {
			continue
		}
		n, _, _, err := c.Acquire(q.Blocks)
		if err != nil {
			continue // larger than the pool: cannot be cached
		}
		c.Release(q.Blocks)
		hit += int64(min(n*w.BlockSize, q.PromptTokens))
	}
	return ratio(hit, prompt)
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
