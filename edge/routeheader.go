package edge

import (
	"fmt"
	"strings"
)

// Route is an x-tether-route header (HeaderRoute) read back: each hop's
// instance and attention-DP rank ("" for a hop that did not happen, or a
// rank the edge does not know).
type Route struct {
	ContextInstance, ContextRank       string
	GenerationInstance, GenerationRank string
}

// ParseRoute reads an x-tether-route header as the edge writes it:
// "context=<instance>/<rank>; generation=<instance>/<rank>", "-" for a hop
// or rank that is not there.
func ParseRoute(h string) (Route, error) {
	var r Route
	for _, part := range strings.Split(h, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return Route{}, fmt.Errorf("bad %s header %q", HeaderRoute, h)
		}
		inst, rank, _ := strings.Cut(v, "/")
		if inst == "-" {
			inst = ""
		}
		if rank == "-" {
			rank = ""
		}
		switch k {
		case "context":
			r.ContextInstance, r.ContextRank = inst, rank
		case "generation":
			r.GenerationInstance, r.GenerationRank = inst, rank
		default:
			return Route{}, fmt.Errorf("bad %s header %q: unknown hop %q", HeaderRoute, h, k)
		}
	}
	return r, nil
}
