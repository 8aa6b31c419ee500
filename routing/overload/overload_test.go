package overload

import (
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func TestTracker(t *testing.T) {
	tr := NewTracker()
	if _, ok := tr.OverloadedSince("a"); ok {
		t.Fatal("unknown instance overloaded")
	}
	tr.Observe("a", true, t0)
	tr.Observe("a", true, t0.Add(time.Minute))
	if s, ok := tr.OverloadedSince("a"); !ok || !s.Equal(t0) {
		t.Fatalf("since %v %v, want %v (first overloaded observation)", s, ok, t0)
	}
	tr.Observe("a", false, t0.Add(2*time.Minute))
	if _, ok := tr.OverloadedSince("a"); ok {
		t.Fatal("healthy observation did not reset")
	}
	tr.Observe("b", true, t0)
	tr.Forget("b")
	if _, ok := tr.OverloadedSince("b"); ok {
		t.Fatal("forgotten instance still tracked")
	}
}
