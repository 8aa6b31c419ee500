package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// RankingTieBand: two policies whose sim hit rates differ by less than this
// are a tie for the ranking comparison (e2e adds timing noise and a
// disaggregated flow the sim does not model; a gap this small is not a
// ranking).
const RankingTieBand = 0.02

// Ranking compares the hit-rate order of policies in sim and e2e mode.
type Ranking struct {
	SimOrder []string `json:"ranking_sim"`
	E2EOrder []string `json:"ranking_e2e"`
	// Exact: the two orders are identical.
	Exact bool `json:"ranking_exact"`
	// Reproduced: every pair the sim separates by at least RankingTieBand
	// is in the same order in e2e.
	Reproduced bool     `json:"ranking_reproduced"`
	Inversions []string `json:"ranking_inversions,omitempty"`
}

// CompareRanking compares the policies present in both lists.
func CompareRanking(sim, e2e []Summary) Ranking {
	simHit := map[string]float64{}
	for _, s := range sim {
		simHit[s.Name] = s.HitRate
	}
	e2eHit := map[string]float64{}
	for _, s := range e2e {
		if _, ok := simHit[s.Name]; ok {
			e2eHit[s.Name] = s.HitRate
		}
	}
	order := func(h map[string]float64) []string {
		var names []string
		for n := range h {
			names = append(names, n)
		}
		slices.SortFunc(names, func(a, b string) int {
			switch {
			case h[a] > h[b]:
				return -1
			case h[a] < h[b]:
				return 1
			}
			return strings.Compare(a, b)
		})
		return names
	}
	r := Ranking{E2EOrder: order(e2eHit)}
	simSub := map[string]float64{}
	for n := range e2eHit {
		simSub[n] = simHit[n]
	}
	r.SimOrder = order(simSub)
	r.Exact = slices.Equal(r.SimOrder, r.E2EOrder)
	r.Reproduced = true
	for i, a := range r.SimOrder {
		for _, b := range r.SimOrder[i+1:] {
			if simSub[a]-simSub[b] >= RankingTieBand && e2eHit[a] <= e2eHit[b] {
				r.Reproduced = false
				r.Inversions = append(r.Inversions, fmt.Sprintf("%s (sim %.3f, e2e %.3f) vs %s (sim %.3f, e2e %.3f)",
					a, simSub[a], e2eHit[a], b, simSub[b], e2eHit[b]))
			}
		}
	}
	return r
}

// WriteText prints the comparison.
func (r Ranking) WriteText(w io.Writer) {
	fmt.Fprintf(w, "ranking by hit rate: sim %s; e2e %s\n", strings.Join(r.SimOrder, " > "), strings.Join(r.E2EOrder, " > "))
	switch {
	case r.Exact:
		fmt.Fprintln(w, "e2e reproduces the sim ranking exactly")
	case r.Reproduced:
		fmt.Fprintf(w, "e2e reproduces the sim ranking (orders differ only between policies within %.2f of each other in sim)\n", RankingTieBand)
	default:
		fmt.Fprintf(w, "e2e does NOT reproduce the sim ranking: %s\n", strings.Join(r.Inversions, "; "))
	}
}
