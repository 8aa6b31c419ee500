package bench

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// An Arrangement places a workload's conversations in time: which offset
// each conversation starts at within the stagger, and how much each
// sub-agent's launch moves. The traces fix what is asked; the arrangement
// is one draw of when. One arrangement is not a result: the same policy's
// hit rate moves by several points between arrangements, so comparisons
// run every policy on the same arrangements and report medians over them.
type Arrangement struct {
	// Seed draws the offsets and jitters (1, 2, …). Seed 0 keeps the
	// offsets derived from each trace id alone and no jitter (the layout
	// of --stagger before arrangements existed).
	Seed uint64
	// Stagger is the spread: each conversation starts at an offset in
	// [0, Stagger).
	Stagger time.Duration
	// SubAgentJitter moves each sub-agent's launch later by a draw in
	// [0, SubAgentJitter) (default DefaultSubAgentJitter with a seed).
	SubAgentJitter time.Duration
	// Burst makes every group of sibling sub-agents start within
	// BurstWindow of each other, each sibling's first request through a
	// different edge (Agent.BurstSibling; the simulator spreads them).
	Burst bool
}

// DefaultSubAgentJitter is the spread of a sub-agent's launch jitter: the
// traces record launch offsets to the millisecond, but a real harness
// launches tools and sub-agents within a couple of seconds of variance.
const DefaultSubAgentJitter = 2 * time.Second

// BurstWindow is how close sibling sub-agents start under --burst.
const BurstWindow = 10 * time.Millisecond

// Arrange applies a to w in place (w must be freshly loaded: offsets are
// overwritten, jitters added once).
func (a Arrangement) Arrange(w *Workload) error {
	if a.Stagger < 0 || a.SubAgentJitter < 0 {
		return fmt.Errorf("bench: arrangement: stagger (%v) and sub-agent jitter (%v) must be >= 0", a.Stagger, a.SubAgentJitter)
	}
	jitter := a.SubAgentJitter
	if jitter == 0 && a.Seed > 0 {
		jitter = DefaultSubAgentJitter
	}
	for _, root := range w.Agents {
		r := rand.New(rand.NewPCG(a.Seed, stringHash(root.ID)))
		if a.Stagger > 0 {
			if a.Seed == 0 {
				root.Start = time.Duration(mix64(stringHash(root.ID)) % uint64(a.Stagger))
			} else {
				root.Start = time.Duration(r.Uint64N(uint64(a.Stagger)))
			}
		}
		arrangeAgent(root, r, jitter, a.Burst)
	}
	w.Burst = w.Burst || a.Burst
	return w.Validate()
}

// arrangeAgent jitters the agent's sub-agent launches and, with burst,
// brings each group of siblings within BurstWindow of its first.
func arrangeAgent(a *Agent, r *rand.Rand, jitter time.Duration, burst bool) {
	groupAt, sibling := time.Duration(0), 0
	for i := range a.Steps {
		st := &a.Steps[i]
		if st.SubAgent == nil {
			continue
		}
		if !st.WithPrevious {
			groupAt, sibling = st.At, 0
		}
		switch {
		case burst:
			if sibling == 0 && jitter > 0 {
				groupAt += time.Duration(r.Int64N(int64(jitter)))
			}
			st.At = groupAt + time.Duration(r.Int64N(int64(BurstWindow)))
			st.WithPrevious = sibling > 0 || st.WithPrevious
			st.SubAgent.BurstSibling = sibling + 1
		case jitter > 0:
			st.At += time.Duration(r.Int64N(int64(jitter)))
		}
		sibling++
		arrangeAgent(st.SubAgent, r, jitter, burst)
	}
}
