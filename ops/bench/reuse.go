package bench

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Reuse splits a run's prompt tokens by what stood between each request
// and the same conversation's previous one, per request: the evidence for
// why two policies' hit rates differ. A conversation's next turn finds its
// prefix in a paged LRU cache when the cache held less than its capacity
// since the previous turn: the previous prompt itself plus, for every other
// conversation served there in between, its longest prompt (successive
// prompts of one conversation share their prefix, so the longest stands for
// its blocks; siblings sharing a parent's prefix are counted apart, an
// over-count). Turns whose working set fits hit (in the trace replay's
// overloaded fleet, 96–98 % of their tokens); turns at twice the capacity
// or more miss (2 %); so a policy's hit rate follows the share of its
// tokens in turns that fit, which is what placement decides.
type Reuse struct {
	Fits    ReuseClass `json:"fits"`     // under the rank's KV capacity
	Over    ReuseClass `json:"over"`     // 1 to 2 × the capacity
	FarOver ReuseClass `json:"far_over"` // 2 × or more
	Moved   ReuseClass `json:"moved"`    // the previous request went to another instance or rank
	First   ReuseClass `json:"first"`    // a conversation's first request
}

// ReuseClass is one class's share of the run's prompt tokens and its hit
// rate.
type ReuseClass struct {
	Share   float64 `json:"share"`
	HitRate float64 `json:"hit_rate"`
	prompt  int64
	cached  int64
}

// classes lists u's classes in report order.
func (u *Reuse) classes() [5]*ReuseClass {
	return [5]*ReuseClass{&u.Fits, &u.Over, &u.FarOver, &u.Moved, &u.First}
}

func (c *ReuseClass) add(rec *RequestRecord) {
	c.prompt += int64(rec.Prompt)
	c.cached += int64(rec.Cached)
}

// ReuseOf classifies recs (one run's) against a rank's KV capacity in
// tokens; nil without a capacity.
func ReuseOf(recs []RequestRecord, rankCapacityTokens int) *Reuse {
	if rankCapacityTokens <= 0 || len(recs) == 0 {
		return nil
	}
	type cacheID struct{ instance, rank int }
	type turn struct {
		agent string
		call  int
	}
	byCache := map[cacheID][]*RequestRecord{}
	last := map[turn]*RequestRecord{}
	for i := range recs {
		r := &recs[i]
		byCache[cacheID{r.Instance, r.Rank}] = append(byCache[cacheID{r.Instance, r.Rank}], r)
		last[turn{r.Agent, r.Call}] = r
	}
	for _, rs := range byCache {
		slices.SortStableFunc(rs, func(a, b *RequestRecord) int { return cmp.Compare(a.Admitted, b.Admitted) })
	}
	var out Reuse
	longest := map[string]int{}
	limit := int64(2 * rankCapacityTokens)
	for i := range recs {
		r := &recs[i]
		prev := last[turn{r.Agent, r.Call - 1}]
		switch {
		case r.Call == 0 || prev == nil:
			out.First.add(r)
			continue
		case prev.Instance != r.Instance || prev.Rank != r.Rank:
			out.Moved.add(r)
			continue
		}
		rs := byCache[cacheID{r.Instance, r.Rank}]
		from, _ := slices.BinarySearchFunc(rs, prev.Admitted, func(x *RequestRecord, t time.Duration) int { return cmp.Compare(x.Admitted, t) })
		clear(longest)
		need := int64(prev.Prompt)
		for _, o := range rs[from:] {
			if o.Admitted >= r.Admitted || need >= limit {
				break
			}
			if o.Agent == r.Agent || o.Admitted <= prev.Admitted {
				continue
			}
			if l := longest[o.Agent]; o.Prompt > l {
				need += int64(o.Prompt - l)
				longest[o.Agent] = o.Prompt
			}
		}
		switch {
		case need < int64(rankCapacityTokens):
			out.Fits.add(r)
		case need < limit:
			out.Over.add(r)
		default:
			out.FarOver.add(r)
		}
	}
	var total int64
	for _, c := range out.classes() {
		total += c.prompt
	}
	for _, c := range out.classes() {
		c.Share, c.HitRate = ratio(c.prompt, total), ratio(c.cached, c.prompt)
	}
	return &out
}

// ReuseStats are the medians (with intervals) over arrangements of each
// Reuse class's share and hit rate.
type ReuseStats struct {
	Fits    ReuseStat `json:"fits"`
	Over    ReuseStat `json:"over"`
	FarOver ReuseStat `json:"far_over"`
	Moved   ReuseStat `json:"moved"`
	First   ReuseStat `json:"first"`
}

// ReuseStat is one class over arrangements.
type ReuseStat struct {
	Share   Stat `json:"share"`
	HitRate Stat `json:"hit_rate"`
}

// reuseStats summarizes the runs' Reuse; nil when a run has none.
func reuseStats(ss []Summary) *ReuseStats {
	var out ReuseStats
	dst := [5]*ReuseStat{&out.Fits, &out.Over, &out.FarOver, &out.Moved, &out.First}
	for k := range dst {
		shares, hits := make([]float64, len(ss)), make([]float64, len(ss))
		for i, s := range ss {
			if s.Reuse == nil {
				return nil
			}
			c := s.Reuse.classes()[k]
			shares[i], hits[i] = c.Share, c.HitRate
		}
		dst[k].Share, dst[k].HitRate = MedianInterval(shares), MedianInterval(hits)
	}
	return &out
}

// writeReuse prints the rows' Reuse medians: share of prompt tokens and
// hit rate per class.
func writeReuse(b *strings.Builder, rows []ArrangedRow) {
	if len(rows) == 0 || rows[0].Reuse == nil {
		return
	}
	b.WriteString("\nPrompt tokens by what their cache held between a conversation's turns (its previous prompt and every other conversation's longest one served there in between, against one rank's KV capacity): median share / hit rate.\n\n")
	b.WriteString("| policy | edges | fits | 1–2 × | ≥ 2 × | moved | first request |\n|---|---:|---|---|---|---|---|\n")
	for _, r := range rows {
		if r.Reuse == nil {
			continue
		}
		u := r.Reuse
		cell := func(c ReuseStat) string { return fmt.Sprintf("%.3f / %.2f", c.Share.Median, c.HitRate.Median) }
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s |\n", r.Name, r.Edges, cell(u.Fits), cell(u.Over), cell(u.FarOver), cell(u.Moved), cell(u.First))
	}
}
