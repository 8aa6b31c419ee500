package routing

import "sort"

// Defaults of the LoRA weights: a load is ~100 ms of engine time (an
// adapter copied from host memory or local disk into a GPU slot), 550
// tokens at the default 5,500 prefill tokens/s; a full instance makes the
// request wait for an adapter's running requests to finish, counted as a
// second of prefill.
const (
	DefaultLoRALoad = 550
	DefaultLoRAFull = 5500
)

// LoRAView is what an edge knows of one instance's LoRA adapters: from
// the engine (vLLM's vllm:lora_requests_info, a tether worker's load
// report) and from the requests this edge sent there lately.
type LoRAView struct {
	// MaxLoRAs is the adapters the instance holds at once (per rank; 0:
	// unknown).
	MaxLoRAs int
	// Loaded are the adapters it holds or is loading, sorted.
	Loaded []string
	// Full: every slot holds an adapter with running requests, so another
	// adapter waits until one drains.
	Full bool
}

// Holds reports whether adapter is among Loaded.
func (l *LoRAView) Holds(adapter string) bool {
	if l == nil {
		return false
	}
	i := sort.SearchStrings(l.Loaded, adapter)
	return i < len(l.Loaded) && l.Loaded[i] == adapter
}

// adapterCost is the LoRA term of a candidate's score: 0 for a base-model
// request or an instance holding the adapter; Weights.LoRALoad for one
// that must load it (also when the instance reports nothing about its
// adapters: a load is then the honest guess), plus Weights.LoRAFull when
// its slots are all taken by running adapters. A load is weighed against
// cache and queue like any other cost: an instance with the adapter but a
// long queue can still lose to an idle one that loads it.
func (r *Router) adapterCost(v *InstanceView, adapter string) float64 {
	if adapter == "" {
		return 0
	}
	w := &r.cfg.Weights
	switch {
	case v.LoRA.Holds(adapter):
		return 0
	case v.LoRA != nil && v.LoRA.Full:
		return w.LoRALoad + w.LoRAFull
	}
	return w.LoRALoad
}
