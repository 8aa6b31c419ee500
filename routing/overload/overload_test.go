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
	if tr.Observe("a", false, t0) {
		t.Fatal("a healthy observation of a healthy instance is no transition")
	}
	if !tr.Observe("a", true, t0) {
		t.Fatal("the first overloaded observation is a transition")
	}
	if tr.Observe("a", true, t0.Add(time.Minute)) {
		t.Fatal("a second overloaded observation is no transition")
	}
	if s, ok := tr.OverloadedSince("a"); !ok || !s.Equal(t0) {
		t.Fatalf("since %v %v, want %v (first overloaded observation)", s, ok, t0)
	}
	if !tr.Observe("a", false, t0.Add(2*time.Minute)) {
		t.Fatal("the reset is a transition")
	}
	if _, ok := tr.OverloadedSince("a"); ok {
		t.Fatal("healthy observation did not reset")
	}
	tr.Observe("b", true, t0)
	tr.Forget("b")
	if _, ok := tr.OverloadedSince("b"); ok {
		t.Fatal("forgotten instance still tracked")
	}
}
