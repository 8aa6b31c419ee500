package routing

import (
	"sync"
	"time"
)

// OverloadHistory says since when an instance has been continuously unable
// to take its bound keys (saturated, unhealthy or cache-degraded).
type OverloadHistory interface {
	OverloadedSince(instance string) (time.Time, bool)
}

// OverloadTracker is the small memory behind rebinding: the edge feeds it
// every time it refreshes an instance's view (Observe with
// Router.Condition(view) != 0), and RouteBound asks it how long the overload
// has lasted. It has no clock of its own; it is safe for concurrent use.
type OverloadTracker struct {
	mu    sync.RWMutex
	since map[string]time.Time
}

// NewOverloadTracker returns an empty tracker.
func NewOverloadTracker() *OverloadTracker {
	return &OverloadTracker{since: make(map[string]time.Time)}
}

// Observe records whether instance is overloaded at now. The first
// overloaded observation starts the clock; a healthy one resets it.
func (t *OverloadTracker) Observe(instance string, overloaded bool, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !overloaded {
		delete(t.since, instance)
		return
	}
	if _, ok := t.since[instance]; !ok {
		t.since[instance] = now
	}
}

// OverloadedSince returns when the current overload of instance started.
func (t *OverloadTracker) OverloadedSince(instance string) (time.Time, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	s, ok := t.since[instance]
	return s, ok
}

// Forget drops instance (it left the fleet).
func (t *OverloadTracker) Forget(instance string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.since, instance)
}
