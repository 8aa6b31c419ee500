package breaker

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// grade feeds n answers one second apart from start: the index predicted
// predicted tokens, the engine had cached; it returns the time after.
func grade(t *testing.T, b *Breaker, n int, predicted, cached int64, start time.Time) time.Time {
	t.Helper()
	at := start
	for i := 0; i < n; i++ {
		if _, err := b.Grade(predicted, cached, 16, at); err != nil {
			t.Fatal(err)
		}
		at = at.Add(time.Second)
	}
	return at
}

func TestIndexRuleOpensWhenClaimsAreNotConfirmed(t *testing.T) {
	b, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	// A healthy index: claims confirmed (within one block: vLLM recomputes
	// the prompt's last block when all of it is cached).
	at := grade(t, b, 30, 1600, 1600-16, t0)
	if st := b.State(at); st != Closed {
		t.Fatalf("confirmed claims: %v", st)
	}
	// The engine restarted and its index did not hear: every claim fails.
	// Of the last 20 claims, fewer than half confirmed: open after the
	// 11th failure.
	at = grade(t, b, 10, 1600, 0, at)
	if b.Open(at) {
		t.Fatal("opened with 10 of 20 claims confirmed (rule: fewer than half)")
	}
	at = grade(t, b, 1, 1600, 0, at)
	if !b.Open(at) {
		t.Fatal("11 of the last 20 claims failed and the breaker is not open")
	}
	if r := b.Reason(at); r != ReasonIndexDisagrees || r.String() != "index_disagrees" {
		t.Fatalf("reason %v", r)
	}
	// Agreement comes back: closes once more than 80% of the last 20
	// claims are confirmed (17 of 20), not before.
	at = grade(t, b, 16, 800, 800, at)
	if !b.Open(at) {
		t.Fatal("closed with 16 of the last 20 claims confirmed (rule: more than 80%)")
	}
	at = grade(t, b, 1, 800, 800, at)
	if st := b.State(at); st != Closed {
		t.Fatalf("17 of 20 confirmed: state %v", st)
	}
	if r := b.Reason(at); r != ReasonNone {
		t.Fatalf("closed with reason %v", r)
	}
}

func TestIndexRuleIgnoresUnderPredictionAndNonClaims(t *testing.T) {
	b, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	// The index said nothing (0 blocks) while the engine had the prompt:
	// a missed opportunity, not a false claim; it is graded but never
	// opens the breaker.
	at := grade(t, b, 50, 0, 1600, t0)
	// Under-prediction on claims: the engine had more than the index said.
	at = grade(t, b, 50, 160, 1600, at)
	if b.Open(at) {
		t.Fatal("under-prediction opened the breaker")
	}
	// The window's 12 slots of 5 s end with the last answer's: the last
	// 60 answers, 10 of the first kind (100 blocks off), 50 of the second
	// (90 blocks off).
	a := b.Accuracy(at.Add(-time.Second))
	if a.Graded != 60 || a.WithinOneBlock != 0 {
		t.Fatalf("window accuracy %+v (want 60 graded in the 60 s window, none within a block)", a)
	}
	if want := (10*100.0 + 50*90.0) / 60; math.Abs(a.MeanAbsErrorBlocks-want) > 1e-9 {
		t.Fatalf("mean absolute error %g blocks, want %g", a.MeanAbsErrorBlocks, want)
	}
	if a.Claims != 20 || a.Confirmed != 20 {
		t.Fatalf("claims %d/%d, want 20/20", a.Confirmed, a.Claims)
	}
}

func TestIndexRuleNeedsMinimumClaimsInWindow(t *testing.T) {
	b, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	// Nine false claims: below the minimum of ten.
	at := grade(t, b, 9, 1600, 0, t0)
	if b.Open(at) {
		t.Fatal("opened on 9 claims")
	}
	// Claims older than the window do not count: after 2 minutes the nine
	// are gone and one more false claim is alone.
	at = grade(t, b, 1, 1600, 0, at.Add(2*time.Minute))
	if b.Open(at) {
		t.Fatal("claims outside the window counted")
	}
	at = grade(t, b, 9, 1600, 0, at)
	if !b.Open(at) {
		t.Fatal("10 false claims within the window did not open")
	}
}

func TestIndexAndHitRateCloseOnlyTheirOwnOpening(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MinLookups, cfg.MinLookupTokens = 5, 1000
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	at := grade(t, b, 10, 1600, 0, t0)
	if !b.Open(at) {
		t.Fatal("setup: index rule did not open")
	}
	// A good hit rate does not close a breaker the index opened.
	at = feed(t, b, 10, 0.9, at)
	if !b.Open(at) || b.Reason(at) != ReasonIndexDisagrees {
		t.Fatalf("hit rate closed an index opening: %v %v", b.State(at), b.Reason(at))
	}
	b2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	at = feed(t, b2, 10, 0.1, t0)
	if !b2.Open(at) || b2.Reason(at) != ReasonHitRate {
		t.Fatalf("setup: %v %v", b2.State(at), b2.Reason(at))
	}
	// Confirmed claims do not close a breaker the hit rate opened.
	at = grade(t, b2, 20, 1600, 1600, at)
	if !b2.Open(at) {
		t.Fatal("confirmed claims closed a hit-rate opening")
	}
}

func TestIndexRuleHalfOpensAfterCooldown(t *testing.T) {
	b, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	at := grade(t, b, 12, 1600, 0, t0)
	if !b.Open(at) {
		t.Fatal("setup: not open")
	}
	at = at.Add(time.Minute)
	if st := b.State(at); st != HalfOpen || b.Reason(at) != ReasonIndexDisagrees {
		t.Fatalf("after the cooldown: %v %v", st, b.Reason(at))
	}
	// The half-open window starts empty: nine failures do not reopen.
	at = grade(t, b, 9, 1600, 0, at)
	if st := b.State(at); st != HalfOpen {
		t.Fatalf("half-open window reopened on 9 claims: %v", st)
	}
	at = grade(t, b, 1, 1600, 0, at)
	if !b.Open(at) {
		t.Fatal("half-open breaker with 10 false claims did not reopen")
	}
}

func TestIndexRuleOffAndValidation(t *testing.T) {
	cfg := DefaultConfig()
	cfg.IndexClaims = 0
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	at := grade(t, b, 40, 1600, 0, t0)
	if b.Open(at) {
		t.Fatal("index_claims 0 still opened")
	}
	if a := b.Accuracy(at); a.Graded != 40 || a.Claims != 0 {
		t.Fatalf("accuracy with the rule off: %+v", a)
	}
	if _, err := b.Grade(-1, 0, 16, at); !errors.Is(err, ErrBadSample) {
		t.Fatalf("negative prediction: %v", err)
	}
	if _, err := b.Grade(16, 0, 0, at); !errors.Is(err, ErrBadSample) {
		t.Fatalf("block size 0: %v", err)
	}
	for _, tc := range []struct {
		mut  func(*Config)
		want string
	}{
		{func(c *Config) { c.IndexClaims = -1 }, "index_claims"},
		{func(c *Config) { c.IndexMinClaims = 21 }, "index_min_claims"},
		{func(c *Config) { c.IndexOpenBelow = 1.5 }, "index_open_below"},
		{func(c *Config) { c.IndexCloseAbove = 0.2 }, "index_close_above"},
	} {
		c := DefaultConfig()
		tc.mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.want, err)
		}
	}
}

func TestSetGradeStatusAccuracy(t *testing.T) {
	s, err := NewSet(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	at := t0
	for i := 0; i < 10; i++ {
		if _, err := s.Grade("w1", 320, 0, 16, at); err != nil {
			t.Fatal(err)
		}
	}
	if st, r := s.Status("w1", at); st != Open || r != ReasonIndexDisagrees {
		t.Fatalf("w1: %v %v", st, r)
	}
	if st, r := s.Status("w2", at); st != Closed || r != ReasonNone {
		t.Fatalf("unknown instance: %v %v", st, r)
	}
	if a := s.Accuracy("w1", at); a.Graded != 10 || a.MeanAbsErrorBlocks != 20 {
		t.Fatalf("accuracy %+v", a)
	}
	if _, err := s.Grade("w1", 1, 0, -3, at); err == nil || !strings.Contains(err.Error(), "w1") {
		t.Fatalf("bad sample error %v", err)
	}
}
