package breaker

import (
	"errors"
	"strings"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func newBreaker(t *testing.T) *Breaker {
	t.Helper()
	cfg := DefaultConfig()
	cfg.MinLookups, cfg.MinLookupTokens = 10, 10_000
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// feed records n requests of 1,000 prompt tokens with the given hit rate,
// one per second starting at start; it returns the time after the last.
func feed(t *testing.T, b *Breaker, n int, rate float64, start time.Time) time.Time {
	t.Helper()
	at := start
	for i := 0; i < n; i++ {
		if _, err := b.Record(1000, int64(rate*1000), at); err != nil {
			t.Fatal(err)
		}
		at = at.Add(time.Second)
	}
	return at
}

func TestBreakerOpensBelowThresholdWithVolume(t *testing.T) {
	b := newBreaker(t)
	at := feed(t, b, 9, 0.1, t0) // 9 lookups: below the minimum volume
	if b.Open(at) {
		t.Fatal("opened on 9 lookups (minimum 10)")
	}
	at = feed(t, b, 1, 0.1, at)
	if !b.Open(at) {
		t.Fatal("10 lookups at 10% did not open")
	}

	// Exactly at the open threshold does not open ("below 40%").
	b2 := newBreaker(t)
	at = feed(t, b2, 20, 0.40, t0)
	if b2.State(at) != Closed {
		t.Fatal("opened at exactly 40%")
	}
	feed(t, b2, 20, 0.30, at) // window average 35%
	if !b2.Open(at.Add(20 * time.Second)) {
		t.Fatal("did not open at 35%")
	}
}

func TestBreakerTokenVolumeMinimum(t *testing.T) {
	b := newBreaker(t)
	at := t0
	for i := 0; i < 50; i++ { // 50 tiny lookups: 2,500 tokens, 0% hits
		if _, err := b.Record(50, 0, at); err != nil {
			t.Fatal(err)
		}
		at = at.Add(time.Second)
	}
	if b.Open(at) {
		t.Fatal("opened below the minimum token volume")
	}
}

func TestBreakerClosesAboveRecoveryThreshold(t *testing.T) {
	b := newBreaker(t)
	at := feed(t, b, 20, 0.2, t0)
	if !b.Open(at) {
		t.Fatal("setup: not open")
	}
	// Hysteresis: a window between 40% and 60% keeps it open. Window now
	// holds 20×20% + 20×80% = 50%.
	at = feed(t, b, 20, 0.8, at)
	if st := b.State(at); st != Open {
		t.Fatalf("window at 50%%: state %v, want open (hysteresis)", st)
	}
	// The bad samples age out of the 60 s window (12 slots of 5 s): at
	// t0+69s it holds samples 10..69, 10 at 20% and 50 at 80%: 70%.
	at = feed(t, b, 30, 0.8, at)
	if st := b.State(at); st != Closed {
		lk, hit, n := b.Window(at)
		t.Fatalf("window %d/%d over %d lookups: state %v, want closed", hit, lk, n, st)
	}
}

func TestBreakerHalfOpenAfterCooldown(t *testing.T) {
	b := newBreaker(t) // cooldown 60s
	feed(t, b, 10, 0.0, t0)
	openedAt := t0.Add(9 * time.Second) // the 10th sample reaches the minimum volume
	if !b.Open(openedAt) || !b.Open(openedAt.Add(59*time.Second)) {
		t.Fatal("closed before the cooldown")
	}
	half := openedAt.Add(60 * time.Second)
	if b.State(half) != HalfOpen || b.Open(half) {
		t.Fatalf("after cooldown: %v, want half-open (affinity flows)", b.State(half))
	}
	// Half-open measures afresh: old 0% samples do not reopen it at once.
	if st, _ := b.Record(1000, 700, half); st != HalfOpen {
		t.Fatalf("first half-open sample: %v", st)
	}
	if lk, _, n := b.Window(half); lk != 1000 || n != 1 {
		t.Fatalf("half-open window not fresh: %d tokens over %d lookups", lk, n)
	}
	at := feed(t, b, 9, 0.7, half.Add(time.Second))
	if st := b.State(at); st != Closed {
		t.Fatalf("good half-open window: %v, want closed", st)
	}
	// A bad half-open window reopens.
	b2 := newBreaker(t)
	at = feed(t, b2, 20, 0.0, t0)
	at = feed(t, b2, 10, 0.1, at.Add(time.Minute))
	if !b2.Open(at) {
		t.Fatalf("bad half-open window: %v, want open again", b2.State(at))
	}
}

func TestBreakerRejectsImpossibleSamples(t *testing.T) {
	b := newBreaker(t)
	for _, s := range [][2]int64{{-1, 0}, {10, -1}, {10, 11}} {
		if _, err := b.Record(s[0], s[1], t0); !errors.Is(err, ErrBadSample) {
			t.Errorf("sample %v: err %v, want ErrBadSample", s, err)
		}
	}
	if lk, _, n := b.Window(t0); lk != 0 || n != 0 {
		t.Fatal("a refused sample was recorded")
	}
	// Late samples count in the newest slot instead of corrupting the ring.
	feed(t, b, 5, 1, t0.Add(time.Hour))
	if _, err := b.Record(1000, 0, t0); err != nil {
		t.Fatal(err)
	}
	if lk, _, n := b.Window(t0.Add(time.Hour + 5*time.Second)); lk != 6000 || n != 6 {
		t.Fatalf("late sample: %d tokens over %d lookups, want 6000/6", lk, n)
	}
}

func TestCacheBreakersPerInstance(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MinLookups, cfg.MinLookupTokens = 1, 0
	cb, err := NewSet(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Record("a", 1000, 0, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Record("b", 1000, 900, t0); err != nil {
		t.Fatal(err)
	}
	if !cb.Open("a", t0) || cb.Open("b", t0) || cb.Open("unknown", t0) {
		t.Fatalf("states: a %v b %v", cb.State("a", t0), cb.State("b", t0))
	}
	if _, err := cb.Record("a", 1, 2, t0); err == nil || !strings.Contains(err.Error(), "instance a") {
		t.Fatalf("bad sample error should name the instance: %v", err)
	}
	cb.Forget("a")
	if cb.Open("a", t0) {
		t.Fatal("forgotten breaker still open")
	}
}

func TestBreakerConfigValidate(t *testing.T) {
	cases := []struct {
		mutate  func(*Config)
		wantKey string
	}{
		{func(c *Config) { c.Window = 0 }, "circuit_breaker.window"},
		{func(c *Config) { c.Buckets = 0 }, "circuit_breaker.buckets"},
		{func(c *Config) { c.OpenBelow = 1.5 }, "circuit_breaker.open_below"},
		{func(c *Config) { c.CloseAbove = 0.2 }, "circuit_breaker.close_above"},
		{func(c *Config) { c.MinLookups = 0 }, "circuit_breaker.min_lookups"},
		{func(c *Config) { c.Cooldown = -1 }, "circuit_breaker.cooldown"},
	}
	for _, c := range cases {
		cfg := DefaultConfig()
		c.mutate(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.wantKey) {
			t.Errorf("want error naming %s, got %v", c.wantKey, err)
		}
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted an invalid config", c.wantKey)
		}
	}
}
