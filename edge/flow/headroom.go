package flow

import "github.com/tether-project/tether/routing"

// Headroom is how many more requests one fleet can start now: over its
// healthy, non-draining instances that report their load, what each may
// still take before its queue passes perRank requests per rank. That is
// an in-flight limit derived from the instance's telemetry: what it runs
// (its reported active requests, which its engine's batch and KV space
// bound) plus perRank waiting per rank, so it stays busy between the
// edge's looks at its load while every request beyond waits at the edge,
// in fair order. The views count the requests every edge sent since the
// instance's last report (fleetview: dispatches told over NATS).
//
// A fleet none of whose instances reports its load (static engines
// without a metrics scrape), or with no healthy instance, is Unlimited:
// flow control cannot tell its saturation, and holds nothing back for it
// (routing answers a fleet with no healthy instance itself).
func Headroom(views []routing.InstanceView, perRank int) int {
	free, measured := 0, false
	for i := range views {
		v := &views[i]
		if !v.Healthy || v.Draining || v.Ranks < 1 {
			continue
		}
		measured = true
		free += max(v.Ranks*perRank-v.QueuedRequests, 0)
	}
	if !measured {
		return Unlimited
	}
	return free
}
