// Package overload is the small memory behind rebinding: since when each
// instance has been continuously unable to take its bound keys. The edge
// feeds it on every view refresh with the router's verdict on the instance
// (routing.Router.Condition); the decision asks it how long the strain has
// lasted (overflow.rebind_after). It has no clock of its own.
package overload

import (
	"sync"
	"time"
)

// History says since when an instance has been continuously unable to take
// its bound keys (saturated or unhealthy).
type History interface {
	OverloadedSince(instance string) (time.Time, bool)
}

// Tracker records overloaded observations per instance; safe for
// concurrent use.
type Tracker struct {
	mu    sync.RWMutex
	since map[string]time.Time
}

// NewTracker returns an empty tracker.
func NewTracker() *Tracker {
	return &Tracker{since: make(map[string]time.Time)}
}

// Observe records whether instance is overloaded at now. The first
// overloaded observation starts the clock; a healthy one resets it. It
// reports whether the observation did either (a transition: what other
// edges need to hear to keep the same history).
func (t *Tracker) Observe(instance string, overloaded bool, now time.Time) (changed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.since[instance]
	if !overloaded {
		delete(t.since, instance)
		return ok
	}
	if !ok {
		t.since[instance] = now
	}
	return !ok
}

// OverloadedSince returns when the current overload of instance started.
func (t *Tracker) OverloadedSince(instance string) (time.Time, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	s, ok := t.since[instance]
	return s, ok
}

// Forget drops instance (it left the fleet).
func (t *Tracker) Forget(instance string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.since, instance)
}
