package api

import (
	"fmt"
	"strconv"
	"strings"
)

// Route is an x-tether-route header (HeaderRoute) read back: each hop's
// instance and attention-DP rank ("" for a hop that did not happen, or a
// rank the edge does not know) and the route evidence (routeEvidence): the
// request id the log's decisions record and, per hop, the index of the
// replica state its decision read.
type Route struct {
	ContextInstance, ContextRank       string
	GenerationInstance, GenerationRank string
	RequestID                          string
	ContextState, GenerationState      uint64
	HasState                           bool // the header carried state indexes
	// ContextOwnKey, GenerationOwnKey: a sub-agent's hop routed by its own
	// conversation id, not its parent's root.
	ContextOwnKey, GenerationOwnKey bool
}

// ParseRoute reads an x-tether-route header as the edge writes it:
// "context=<instance>/<rank>; generation=<instance>/<rank>", "-" for a hop
// or rank that is not there, then the route evidence: "; request=<id>;
// context_state=<n>[; context_key=own]; generation_state=<n>[;
// generation_key=own]".
func ParseRoute(h string) (Route, error) {
	var r Route
	for _, part := range strings.Split(h, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return Route{}, fmt.Errorf("bad %s header %q", HeaderRoute, h)
		}
		if err := r.set(k, v); err != nil {
			return Route{}, fmt.Errorf("bad %s header %q: %w", HeaderRoute, h, err)
		}
	}
	return r, nil
}

// set reads one "k=v" part of the header into r.
func (r *Route) set(k, v string) error {
	switch k {
	case "context", "generation":
		inst, rank, _ := strings.Cut(v, "/")
		if inst == "-" {
			inst = ""
		}
		if rank == "-" {
			rank = ""
		}
		if k == "context" {
			r.ContextInstance, r.ContextRank = inst, rank
		} else {
			r.GenerationInstance, r.GenerationRank = inst, rank
		}
	case "request":
		r.RequestID = v
	case "context_state", "generation_state":
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		if k == "context_state" {
			r.ContextState = n
		} else {
			r.GenerationState = n
		}
		r.HasState = true
	case "context_key", "generation_key":
		if v != "own" {
			return fmt.Errorf("%s: unknown value %q", k, v)
		}
		if k == "context_key" {
			r.ContextOwnKey = true
		} else {
			r.GenerationOwnKey = true
		}
	default:
		return fmt.Errorf("unknown hop %q", k)
	}
	return nil
}

// Response headers.
const (
	// HeaderRoute names the instances and ranks of both hops
	// ("context=<instance>/<rank>; generation=<instance>/<rank>", "-" for
	// a hop that did not happen) when debug_route_header is on, then the
	// request's id as the log records it in its decisions
	// ("; request=<id>") and, per hop, the index of the replica state its
	// decision read ("; context_state=<n>; generation_state=<n>"), and
	// "; context_key=own" for a sub-agent's hop routed by its own
	// conversation id rather than its parent's root: what a checker judges
	// the answer against.
	HeaderRoute = "x-tether-route"
	// HeaderADPRank relays the final worker's attention-DP rank.
	HeaderADPRank = "x-tether-adp-rank"
)
