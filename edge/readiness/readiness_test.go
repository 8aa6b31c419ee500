package readiness

import (
	"testing"
	"time"
)

// stateLag measures how long ago a leader reported the oldest state index
// this node has not reached.
func TestStateLagMeasuresTheOldestUnreachedLeaderIndex(t *testing.T) {
	var l stateLag
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	l.observe(at(0), 10, 10) // caught up: nothing to wait for
	if d, _ := l.behind(at(time.Second), 10); d != 0 {
		t.Fatalf("caught up, behind %s", d)
	}
	l.observe(at(0), 20, 10)
	l.observe(at(100*time.Millisecond), 30, 10)
	l.observe(at(200*time.Millisecond), 30, 10) // same index: the older sample stands
	if d, idx := l.behind(at(6*time.Second), 10); d != 6*time.Second || idx != 20 {
		t.Fatalf("behind %s at %d, want 6s at 20", d, idx)
	}
	// Applying 20 leaves 30, reported 100 ms later.
	if d, idx := l.behind(at(6*time.Second), 25); d != 5900*time.Millisecond || idx != 30 {
		t.Fatalf("behind %s at %d, want 5.9s at 30", d, idx)
	}
	if d, _ := l.behind(at(6*time.Second), 30); d != 0 {
		t.Fatalf("caught up with 30, behind %s", d)
	}
	// A restore moves the leader back: what it reported above is dropped.
	l.observe(at(7*time.Second), 50, 30)
	l.observe(at(8*time.Second), 40, 30)
	if d, idx := l.behind(at(9*time.Second), 30); d != time.Second || idx != 40 {
		t.Fatalf("after a restore behind %s at %d, want 1s at 40", d, idx)
	}
	// Bounded.
	for i := range 2 * maxLagSamples {
		l.observe(at(10*time.Second), uint64(100+i), 30)
	}
	if len(l.samples) > maxLagSamples {
		t.Fatalf("%d samples kept, bound %d", len(l.samples), maxLagSamples)
	}
}
