// Package bench is tether's benchmark harness. It replays real agentic traces
// and the synthetic agent patterns (docs/agent-workloads.md) through the REAL routing code
// (routing, routing/kvindex), the REAL affinity log (cluster nodes over
// loopback TCP, or fsm machines fed by one sequencer) and the simulated
// workers' REAL scheduler and caches (worker/adp, worker/kvcache through
// worker/engine/sim.VirtualRank), in virtual time: an event queue, no
// sleeping, the same seed gives the same numbers. It compares routing
// policies and edge counts, and can replay the same workload over HTTP
// against a running deployment (e2e mode). See DESIGN.md.
package bench

import (
	"fmt"
	"time"

	"github.com/tether-project/tether/internal/hash64"
	"github.com/tether-project/tether/internal/prefix"
)

// Workload is a set of root agents (conversations) replayed together, all
// starting at virtual time 0 plus their own Start offset.
type Workload struct {
	Name      string
	BlockSize int // tokens per KV block; every Request.Blocks uses it
	Agents    []*Agent
	// Burst: sibling sub-agents start together and their first requests
	// go through different edges (Arrangement.Burst).
	Burst bool
}

// Agent is one conversation with its own session id: a root conversation or
// a sub-agent of Parent.
type Agent struct {
	ID     string // session id (x-session-id), unique in the workload
	Parent *Agent // nil for a root conversation
	Kind   string // sub-agent type or pattern role, informational
	// Start delays a root agent's start (sub-agents start when launched).
	Start time.Duration
	Steps []Step
	// Next, for a root conversation, is the one its client starts when it
	// ends (a closed loop: SessionWorkload); Chained marks a conversation
	// started that way rather than at Start.
	Next    *Agent
	Chained bool
	// BurstSibling is the sub-agent's 1-based place among the siblings it
	// was launched with, under Arrangement.Burst (0 otherwise).
	BurstSibling int
}

// Step is one item of an agent's script: a request or a sub-agent launch.
//
// Steps run in groups: a step with WithPrevious joins the group of the step
// before it. A group starts when every step of the previous group finished
// (a request's last token, a sub-agent's last request); each step of a
// group is launched at max(group start, agent start + At). So a trace's
// sequential requests are one-step groups, a run of sub-agents launched
// together is one group, and the parent's next request waits for them.
type Step struct {
	At           time.Duration // offset from the agent's start (a trace's t, scaled)
	WithPrevious bool
	Request      *Request // exactly one of Request and SubAgent is set
	SubAgent     *Agent
}

// Request is one LLM call.
type Request struct {
	PromptTokens int
	OutputTokens int
	Stream       bool
	// Keys name each prompt block's content: equal keys at equal
	// positions are equal token blocks (a trace's namespaced hash ids, or
	// a synthetic prompt's block contents). Blocks are their chained
	// hashes, what caches and the KV index hold.
	Keys   []uint64
	Blocks []uint64
	// Messages is the prompt as chat messages, for synthetic workloads
	// (nil for traces: e2e mode synthesises text from Keys).
	Messages []prefix.Message
	// Adapter is the LoRA adapter the request names ("" the base model):
	// its Blocks are the adapter's (prefix.AdapterBlockHashes) and the
	// simulated engines hold it in a slot while it runs (lora.go).
	Adapter string
}

// SubAgent reports whether a belongs to a parent conversation.
func (a *Agent) SubAgent() bool { return a.Parent != nil }

// Root is the agent's root conversation.
func (a *Agent) Root() *Agent {
	for a.Parent != nil {
		a = a.Parent
	}
	return a
}

// Depth is 0 for a root conversation, 1 for its sub-agents, and so on.
func (a *Agent) Depth() int {
	d := 0
	for p := a.Parent; p != nil; p = p.Parent {
		d++
	}
	return d
}

// Walk calls fn for every agent of the workload (roots and sub-agents,
// depth first, in script order).
func (w *Workload) Walk(fn func(*Agent)) {
	var visit func(a *Agent)
	visit = func(a *Agent) {
		fn(a)
		for _, s := range a.Steps {
			if s.SubAgent != nil {
				visit(s.SubAgent)
			}
		}
	}
	for _, a := range w.Agents {
		visit(a)
	}
}

// WalkRequests calls fn for every request with its agent, in script order.
func (w *Workload) WalkRequests(fn func(*Agent, *Request)) {
	w.Walk(func(a *Agent) {
		for _, s := range a.Steps {
			if s.Request != nil {
				fn(a, s.Request)
			}
		}
	})
}

// Stats summarises a workload.
type Stats struct {
	Conversations int
	SubAgents     int
	Requests      int
	SubRequests   int
	PromptTokens  int64
	Blocks        int64
	MaxBlocks     int
}

// Stats counts the workload's agents, requests and tokens.
func (w *Workload) Stats() Stats {
	var s Stats
	s.Conversations = len(w.Agents)
	w.Walk(func(a *Agent) {
		if a.SubAgent() {
			s.SubAgents++
		}
	})
	w.WalkRequests(func(a *Agent, r *Request) {
		s.Requests++
		if a.SubAgent() {
			s.SubRequests++
		}
		s.PromptTokens += int64(r.PromptTokens)
		s.Blocks += int64(len(r.Blocks))
		s.MaxBlocks = max(s.MaxBlocks, len(r.Blocks))
	})
	return s
}

// Validate checks the invariants the simulator relies on.
func (w *Workload) Validate() error {
	if w.BlockSize < 1 {
		return fmt.Errorf("bench: workload %s: block size %d", w.Name, w.BlockSize)
	}
	seen := map[string]bool{}
	var err error
	w.Walk(func(a *Agent) {
		if err != nil {
			return
		}
		if a.ID == "" {
			err = fmt.Errorf("bench: workload %s: agent with an empty id", w.Name)
			return
		}
		if seen[a.ID] {
			err = fmt.Errorf("bench: workload %s: duplicate agent id %q", w.Name, a.ID)
			return
		}
		seen[a.ID] = true
		for i, s := range a.Steps {
			switch {
			case (s.Request == nil) == (s.SubAgent == nil):
				err = fmt.Errorf("bench: workload %s: agent %s step %d: exactly one of request and sub-agent must be set", w.Name, a.ID, i)
			case s.At < 0:
				err = fmt.Errorf("bench: workload %s: agent %s step %d: negative offset %v", w.Name, a.ID, i, s.At)
			case s.SubAgent != nil && s.SubAgent.Parent != a:
				err = fmt.Errorf("bench: workload %s: agent %s step %d: sub-agent %s names another parent", w.Name, a.ID, i, s.SubAgent.ID)
			case s.Request != nil && (s.Request.PromptTokens < 0 || s.Request.OutputTokens < 1 || len(s.Request.Keys) != len(s.Request.Blocks)):
				err = fmt.Errorf("bench: workload %s: agent %s step %d: invalid request (prompt %d, output %d, %d keys, %d blocks)",
					w.Name, a.ID, i, s.Request.PromptTokens, s.Request.OutputTokens, len(s.Request.Keys), len(s.Request.Blocks))
			}
			if err != nil {
				return
			}
		}
	})
	return err
}

// ChainBlocks returns the chained hashes of block keys: block i's hash
// depends on keys 0..i (internal/prefix.ChainHash over the key's two 32-bit
// halves), so two prompts share hashes exactly as long as they share a key
// prefix, as real KV block hashes do.
func ChainBlocks(keys []uint64) []uint64 {
	out := make([]uint64, len(keys))
	var prev uint64
	var pair [2]uint32
	for i, k := range keys {
		pair[0], pair[1] = uint32(k), uint32(k>>32)
		prev = prefix.ChainHash(prev, pair[:])
		out[i] = prev
	}
	return out
}

// namespaceKey derives the content key of a trace-local hash id.
func namespaceKey(ns uint64, id int64) uint64 {
	return mix64(ns ^ mix64(uint64(id)+0x632be59bd9b4e019))
}

// stringHash and mix64 are the shared fixed hashes (internal/hash64).
var (
	stringHash = hash64.FNV1a
	mix64      = hash64.Mix64
)
