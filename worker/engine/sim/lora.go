package sim

import (
	"container/heap"
	"slices"
	"time"
)

// loraSlots are one rank's LoRA adapter slots (Config.MaxLoRAs), as
// vLLM's LoRA manager keeps them: an adapter is loaded into a slot before
// its first request's prefill (Config.LoRALoadTime, during which the rank
// does nothing else), stays while requests use it, and the least recently
// used idle one makes room for another. When every slot holds an adapter
// with admitted requests, a request for another waits until one of them
// drains (vLLM's scheduler skips it while max_loras adapters are running).
type loraSlots struct {
	max   int
	slots []string       // least recently used first
	refs  map[string]int // admitted, unreleased requests per adapter
	loads int64
}

// acquireAdapter gives req's adapter a slot at start: ok when the rank
// holds it; else loads it into a free slot or an idle one, waiting (start
// moves on) for admitted requests to finish while none is idle. loaded
// says a load happened.
func (r *VirtualRank) acquireAdapter(adapter string, start time.Duration) (_ time.Duration, loaded bool) {
	l := &r.lora
	if adapter == "" || r.cfg.MaxLoRAs <= 0 {
		return start, false
	}
	l.max = r.cfg.MaxLoRAs
	for {
		if i := slices.Index(l.slots, adapter); i >= 0 {
			l.slots = append(slices.Delete(l.slots, i, i+1), adapter)
			return start, false
		}
		if len(l.slots) < l.max {
			l.slots = append(l.slots, adapter)
			l.loads++
			return start, true
		}
		for i, a := range l.slots {
			if l.refs[a] == 0 {
				l.slots = append(slices.Delete(l.slots, i, i+1), adapter)
				l.loads++
				return start, true
			}
		}
		if len(r.pending) == 0 {
			// Busy slots without admitted requests cannot happen; take
			// the least recently used rather than wait forever.
			l.slots = append(l.slots[1:], adapter)
			l.loads++
			return start, true
		}
		next := r.popPending()
		r.release(next)
		start = max(start, next.doneAt)
	}
}

// hold and unhold count an admitted request of adapter.
func (l *loraSlots) hold(adapter string) {
	if adapter == "" {
		return
	}
	if l.refs == nil {
		l.refs = map[string]int{}
	}
	l.refs[adapter]++
}

func (l *loraSlots) unhold(adapter string) {
	if adapter == "" || l.refs[adapter] == 0 {
		return
	}
	if l.refs[adapter]--; l.refs[adapter] == 0 {
		delete(l.refs, adapter)
	}
}

// stats are the slots (least recently used first), the adapters with
// admitted requests (sorted) and the loads so far.
func (l *loraSlots) stats() (held, running []string, loads int64) {
	held = slices.Clone(l.slots)
	for a := range l.refs {
		running = append(running, a)
	}
	slices.Sort(running)
	return held, running, l.loads
}

// HoldsAdapter reports whether the rank holds adapter in a slot.
func (r *VirtualRank) HoldsAdapter(adapter string) bool {
	return slices.Contains(r.lora.slots, adapter)
}

// popPending removes the admitted request that finishes first.
func (r *VirtualRank) popPending() *admitted { return heap.Pop(&r.pending).(*admitted) }

// LoRAState is the rank's adapter slots without advancing time: the held
// adapters (least recently used first) and those with admitted requests,
// as a worker's load report carries them.
func (r *VirtualRank) LoRAState() (held, running []string) {
	held, running, _ = r.lora.stats()
	return held, running
}
