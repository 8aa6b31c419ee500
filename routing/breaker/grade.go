package breaker

import (
	"fmt"
	"time"
)

// Reason is why a breaker opened.
type Reason uint8

const (
	// ReasonNone: the breaker has not opened.
	ReasonNone Reason = iota
	// ReasonHitRate: the instance's prefix-cache hit rate fell below
	// OpenBelow.
	ReasonHitRate
	// ReasonIndexDisagrees: the edge's KV index claimed blocks the engine
	// did not have (IndexOpenBelow).
	ReasonIndexDisagrees
)

func (r Reason) String() string {
	switch r {
	case ReasonNone:
		return ""
	case ReasonHitRate:
		return "hit_rate"
	case ReasonIndexDisagrees:
		return "index_disagrees"
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// validateIndex checks the index rule's fields.
func (c Config) validateIndex() []error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("circuit_breaker.%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if c.IndexClaims < 0 || c.IndexClaims > 4096 {
		bad("index_claims", "must be 0..4096 (0: no index rule), got %d", c.IndexClaims)
	}
	if c.IndexClaims <= 0 {
		return errs
	}
	if c.IndexMinClaims < 1 || c.IndexMinClaims > c.IndexClaims {
		bad("index_min_claims", "must be 1..index_claims (%d), got %d", c.IndexClaims, c.IndexMinClaims)
	}
	for _, x := range []struct {
		key string
		v   float64
	}{{"index_open_below", c.IndexOpenBelow}, {"index_close_above", c.IndexCloseAbove}} {
		if !(x.v >= 0 && x.v <= 1) {
			bad(x.key, "must be a fraction in [0, 1], got %g", x.v)
		}
	}
	if c.IndexCloseAbove < c.IndexOpenBelow {
		bad("index_close_above", "%g must be >= index_open_below (%g)", c.IndexCloseAbove, c.IndexOpenBelow)
	}
	return errs
}

// gradeSums are one time slot's graded answers.
type gradeSums struct {
	graded int
	within int   // |predicted − cached| at most one block
	errMB  int64 // Σ |predicted − cached| in thousandths of a block
}

// claim is one answer for which the index said at least one block was
// cached: confirmed when the engine's cached tokens came within one block
// of it.
type claim struct {
	at        int64
	confirmed bool
}

// claimRing holds the last len(buf) claims.
type claimRing struct {
	buf  []claim
	next int
	n    int
}

func (r *claimRing) push(c claim) {
	if len(r.buf) == 0 {
		return
	}
	r.buf[r.next] = c
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
}

func (r *claimRing) reset() { r.next, r.n = 0, 0 }

// count returns the claims made after since, and how many were confirmed.
func (r *claimRing) count(since int64) (total, confirmed int) {
	for i := 0; i < r.n; i++ {
		c := r.buf[i]
		if c.at > since {
			total++
			if c.confirmed {
				confirmed++
			}
		}
	}
	return total, confirmed
}

// Grade adds one graded answer: the KV index said predictedTokens of the
// prompt were cached on the instance when the request was placed, and the
// engine's answer said cachedTokens were (usage cached_tokens), in blocks
// of blockSize tokens. An answer the index made a claim for (at least one
// block) feeds the index rule; every answer counts in Accuracy. It returns
// the state after the answer; impossible figures are refused with an error
// wrapping ErrBadSample.
func (b *Breaker) Grade(predictedTokens, cachedTokens, blockSize int64, now time.Time) (State, error) {
	if predictedTokens < 0 || cachedTokens < 0 || blockSize <= 0 {
		return b.State(now), fmt.Errorf("circuit breaker: graded answer %d predicted, %d cached, block size %d: %w",
			predictedTokens, cachedTokens, blockSize, ErrBadSample)
	}
	n := now.UnixNano()
	bk, idx := b.slot(n)
	b.newest, b.hasData = idx, true
	diff := predictedTokens - cachedTokens
	if diff < 0 {
		diff = -diff
	}
	bk.grades.graded++
	if diff <= blockSize {
		bk.grades.within++
	}
	bk.grades.errMB += diff * 1000 / blockSize
	if b.cfg.IndexClaims > 0 && predictedTokens >= blockSize {
		b.claims.push(claim{at: n, confirmed: cachedTokens >= predictedTokens-blockSize})
		b.evaluateIndex(n)
	}
	return b.state, nil
}

// evaluateIndex applies the index rule to the claims of the window ending
// at now.
func (b *Breaker) evaluateIndex(now int64) {
	total, confirmed := b.claims.count(now - int64(b.cfg.Window))
	if total < b.cfg.IndexMinClaims || total == 0 {
		return
	}
	share := float64(confirmed) / float64(total)
	switch {
	case share < b.cfg.IndexOpenBelow && b.state != Open:
		b.state, b.openedAt, b.reason = Open, now, ReasonIndexDisagrees
	case share > b.cfg.IndexCloseAbove && b.state != Closed && b.reason == ReasonIndexDisagrees:
		b.state = Closed
	}
}

// Accuracy is what the graded answers say of an instance's KV index.
type Accuracy struct {
	// Graded answers in the window, WithinOneBlock of them predicted
	// within one block, and their mean absolute error in blocks.
	Graded             int
	WithinOneBlock     int
	MeanAbsErrorBlocks float64
	// Claims: the index rule's claims (its last IndexClaims within the
	// window), Confirmed of them by the engine.
	Claims, Confirmed int
}

// WithinShare is WithinOneBlock / Graded (0 with none).
func (a Accuracy) WithinShare() float64 {
	if a.Graded == 0 {
		return 0
	}
	return float64(a.WithinOneBlock) / float64(a.Graded)
}

// Accuracy returns the graded answers of the window ending at now.
func (b *Breaker) Accuracy(now time.Time) Accuracy {
	n := now.UnixNano()
	idx := floorDiv(n, b.width)
	if b.hasData && idx < b.newest {
		idx = b.newest
	}
	var a Accuracy
	var errMB int64
	oldest := idx - int64(len(b.ring)) + 1
	for _, bk := range b.ring {
		if bk.valid && bk.id >= oldest && bk.id <= idx {
			a.Graded += bk.grades.graded
			a.WithinOneBlock += bk.grades.within
			errMB += bk.grades.errMB
		}
	}
	if a.Graded > 0 {
		a.MeanAbsErrorBlocks = float64(errMB) / 1000 / float64(a.Graded)
	}
	a.Claims, a.Confirmed = b.claims.count(n - int64(b.cfg.Window))
	return a
}

// Reason is why the breaker is open or half-open at now (ReasonNone while
// closed).
func (b *Breaker) Reason(now time.Time) Reason {
	if b.State(now) == Closed {
		return ReasonNone
	}
	return b.reason
}

// Grade feeds instance's breaker with a graded answer (see Breaker.Grade).
func (c *Set) Grade(instance string, predictedTokens, cachedTokens, blockSize int64, now time.Time) (State, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, err := c.get(instance).Grade(predictedTokens, cachedTokens, blockSize, now)
	if err != nil {
		return st, fmt.Errorf("instance %s: %w", instance, err)
	}
	return st, nil
}

// Status returns instance's breaker state at now and why it is not closed
// (closed and ReasonNone when unknown).
func (c *Set) Status(instance string, now time.Time) (State, Reason) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.m[instance]; ok {
		return b.State(now), b.Reason(now)
	}
	return Closed, ReasonNone
}

// Accuracy returns instance's graded answers at now (zero when unknown).
func (c *Set) Accuracy(instance string, now time.Time) Accuracy {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.m[instance]; ok {
		return b.Accuracy(now)
	}
	return Accuracy{}
}
