// Package breaker is the per-instance cache circuit breaker: a
// deterministic state machine over a ring of time slots, fed with the
// prompt tokens looked up and hit per response. It has no clock (time is a
// parameter) and knows nothing of routing: the edge sets an instance view's
// CacheDegraded from it, and placement stops crediting that instance's
// cache (routing/DESIGN.md §4).
package breaker

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Config configures the per-instance cache circuit breaker. An
// instance whose prefix-cache hit rate falls below OpenBelow over Window
// (with at least MinLookups lookups and MinLookupTokens tokens looked up) is
// cache-degraded: placement stops crediting its cache (a bound key does not
// move for it). It recovers when the rate rises above CloseAbove,
// or, after Cooldown, goes half-open: affinity flows again and a fresh
// window decides.
//
// The same breaker opens when the edge's KV index disagrees with the
// engine (grade.go): of the index's last IndexClaims claims on the instance
// (answers for which it said at least one block was cached) within Window,
// at least IndexMinClaims, fewer than IndexOpenBelow were confirmed by the
// engine's cached tokens. It closes again when more than IndexCloseAbove
// are. IndexClaims 0 turns that rule off.
type Config struct {
	Window          time.Duration `yaml:"window"`
	Buckets         int           `yaml:"buckets"` // window resolution
	OpenBelow       float64       `yaml:"open_below"`
	CloseAbove      float64       `yaml:"close_above"`
	MinLookups      int           `yaml:"min_lookups"`
	MinLookupTokens int64         `yaml:"min_lookup_tokens"`
	Cooldown        time.Duration `yaml:"cooldown"`
	IndexClaims     int           `yaml:"index_claims"`
	IndexMinClaims  int           `yaml:"index_min_claims"`
	IndexOpenBelow  float64       `yaml:"index_open_below"`
	IndexCloseAbove float64       `yaml:"index_close_above"`
}

// DefaultConfig: open below 40% over 60 s, close above 60%, at least
// 20 lookups and 50,000 tokens looked up (a handful of agentic prompts), a
// 60 s cooldown before a half-open retry; the index rule over its last 20
// claims (at least 10): open when fewer than half were confirmed, close
// when more than 80% were.
func DefaultConfig() Config {
	return Config{
		Window:          60 * time.Second,
		Buckets:         12,
		OpenBelow:       0.40,
		CloseAbove:      0.60,
		MinLookups:      20,
		MinLookupTokens: 50_000,
		Cooldown:        60 * time.Second,
		IndexClaims:     20,
		IndexMinClaims:  10,
		IndexOpenBelow:  0.5,
		IndexCloseAbove: 0.8,
	}
}

// Validate checks the fields, naming the key (under circuit_breaker.).
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("circuit_breaker.%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if c.Window <= 0 {
		bad("window", "must be > 0, got %s", c.Window)
	}
	if c.Buckets < 1 || c.Buckets > 3600 {
		bad("buckets", "must be 1..3600, got %d", c.Buckets)
	} else if c.Window > 0 && c.Window/time.Duration(c.Buckets) <= 0 {
		bad("buckets", "window %s is too short for %d buckets", c.Window, c.Buckets)
	}
	rate := func(key string, v float64) {
		if math.IsNaN(v) || v < 0 || v > 1 {
			bad(key, "must be a fraction in [0, 1], got %g", v)
		}
	}
	rate("open_below", c.OpenBelow)
	rate("close_above", c.CloseAbove)
	if c.CloseAbove < c.OpenBelow {
		bad("close_above", "%g must be >= open_below (%g)", c.CloseAbove, c.OpenBelow)
	}
	if c.MinLookups < 1 {
		bad("min_lookups", "must be >= 1, got %d", c.MinLookups)
	}
	if c.MinLookupTokens < 0 {
		bad("min_lookup_tokens", "must be >= 0, got %d", c.MinLookupTokens)
	}
	if c.Cooldown <= 0 {
		bad("cooldown", "must be > 0, got %s", c.Cooldown)
	}
	errs = append(errs, c.validateIndex()...)
	return errors.Join(errs...)
}

// State is a cache circuit breaker's state.
type State uint8

const (
	Closed State = iota
	// Open: cache-degraded; no affinity to this instance.
	Open
	// HalfOpen: cooldown over; affinity flows while a fresh
	// window measures the hit rate.
	HalfOpen
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return fmt.Sprintf("breaker_state(%d)", uint8(s))
}

// ErrBadSample is wrapped by Record's error for impossible figures.
var ErrBadSample = errors.New("invalid cache sample")

type bucket struct {
	id            int64 // window-resolution time slot
	valid         bool
	lookups, hits int64
	records       int
	grades        gradeSums // graded answers (grade.go)
}

// Breaker is one instance's cache circuit breaker: a deterministic
// state machine fed with (lookup tokens, hit tokens, now). It has no clock;
// it is not safe for concurrent use (Set is).
type Breaker struct {
	cfg      Config
	width    int64 // bucket width, ns
	ring     []bucket
	newest   int64
	hasData  bool
	state    State
	openedAt int64
	// reason is why the breaker last opened (ReasonHitRate,
	// ReasonIndexDisagrees); only that condition closes it.
	reason Reason
	claims claimRing // the index's last claims (grade.go)
}

// New returns a closed breaker.
func New(cfg Config) (*Breaker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return closedBreaker(cfg), nil
}

// closedBreaker is a closed breaker over a valid cfg.
func closedBreaker(cfg Config) *Breaker {
	return &Breaker{
		cfg:    cfg,
		width:  int64(cfg.Window / time.Duration(cfg.Buckets)),
		ring:   make([]bucket, cfg.Buckets),
		claims: claimRing{buf: make([]claim, cfg.IndexClaims)},
	}
}

// Record adds one sample: lookupTokens prompt tokens were looked up in the
// instance's prefix cache and hitTokens of them were found (the edge takes
// both from the response's usage: prompt tokens and cached tokens). A
// sample older than the newest one counts in the newest slot. It returns
// the state after the sample; impossible figures (negative, or more hits
// than lookups) are refused with an error wrapping ErrBadSample.
func (b *Breaker) Record(lookupTokens, hitTokens int64, now time.Time) (State, error) {
	if lookupTokens < 0 || hitTokens < 0 || hitTokens > lookupTokens {
		return b.State(now), fmt.Errorf("circuit breaker: %d hit tokens of %d looked up: %w", hitTokens, lookupTokens, ErrBadSample)
	}
	n := now.UnixNano()
	bk, idx := b.slot(n)
	bk.lookups += lookupTokens
	bk.hits += hitTokens
	if lookupTokens > 0 {
		bk.records++
	}
	b.newest, b.hasData = idx, true
	b.evaluate(idx, n)
	return b.state, nil
}

// slot returns the time slot a sample at n counts in (the newest one for a
// late sample), first going half-open when an open breaker's cooldown has
// passed.
func (b *Breaker) slot(n int64) (*bucket, int64) {
	if b.state == Open && n >= b.openedAt+int64(b.cfg.Cooldown) {
		// Half-open: measure afresh, without the degraded period's data.
		b.state = HalfOpen
		clear(b.ring)
		b.hasData = false
		b.claims.reset()
	}
	idx := floorDiv(n, b.width)
	if b.hasData && idx < b.newest {
		idx = b.newest
	}
	bk := &b.ring[mod(idx, int64(len(b.ring)))]
	if !bk.valid || bk.id != idx {
		*bk = bucket{id: idx, valid: true}
	}
	return bk, idx
}

// evaluate applies the hit-rate rule to the window ending in slot idx.
func (b *Breaker) evaluate(idx, now int64) {
	lookups, hits, records := b.sum(idx)
	if records < b.cfg.MinLookups || lookups < b.cfg.MinLookupTokens || lookups == 0 {
		return
	}
	rate := float64(hits) / float64(lookups)
	switch {
	case rate < b.cfg.OpenBelow && b.state != Open:
		b.state, b.openedAt, b.reason = Open, now, ReasonHitRate
	case rate > b.cfg.CloseAbove && b.state != Closed && b.reason == ReasonHitRate:
		b.state = Closed
	}
}

func (b *Breaker) sum(idx int64) (lookups, hits int64, records int) {
	oldest := idx - int64(len(b.ring)) + 1
	for _, bk := range b.ring {
		if bk.valid && bk.id >= oldest && bk.id <= idx {
			lookups += bk.lookups
			hits += bk.hits
			records += bk.records
		}
	}
	return lookups, hits, records
}

// State returns the state at now: an open breaker reads as half-open once
// its cooldown has passed (the next Record makes it so).
func (b *Breaker) State(now time.Time) State {
	if b.state == Open && now.UnixNano() >= b.openedAt+int64(b.cfg.Cooldown) {
		return HalfOpen
	}
	return b.state
}

// Open reports whether the instance is cache-degraded at now.
func (b *Breaker) Open(now time.Time) bool { return b.State(now) == Open }

// Window returns the tokens looked up and hit, and the number of lookups,
// in the window ending at now.
func (b *Breaker) Window(now time.Time) (lookupTokens, hitTokens int64, lookups int) {
	idx := floorDiv(now.UnixNano(), b.width)
	if b.hasData && idx < b.newest {
		idx = b.newest
	}
	return b.sum(idx)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// Set holds one Breaker per instance; safe for concurrent
// use. The edge records samples as responses complete and sets
// InstanceView.CacheDegraded from Open.
type Set struct {
	cfg Config
	mu  sync.Mutex
	m   map[string]*Breaker
}

// NewSet validates cfg and returns an empty set.
func NewSet(cfg Config) (*Set, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Set{cfg: cfg, m: make(map[string]*Breaker)}, nil
}

// Record feeds instance's breaker (see Breaker.Record).
func (c *Set) Record(instance string, lookupTokens, hitTokens int64, now time.Time) (State, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, err := c.get(instance).Record(lookupTokens, hitTokens, now)
	if err != nil {
		return st, fmt.Errorf("instance %s: %w", instance, err)
	}
	return st, nil
}

// get returns instance's breaker, a new closed one if it has none (under
// c.mu).
func (c *Set) get(instance string) *Breaker {
	b, ok := c.m[instance]
	if !ok {
		b = closedBreaker(c.cfg)
		c.m[instance] = b
	}
	return b
}

// State returns instance's breaker state at now (closed when unknown).
func (c *Set) State(instance string, now time.Time) State {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.m[instance]; ok {
		return b.State(now)
	}
	return Closed
}

// Open reports whether instance is cache-degraded at now.
func (c *Set) Open(instance string, now time.Time) bool {
	return c.State(instance, now) == Open
}

// Forget drops instance's breaker (the instance left the fleet).
func (c *Set) Forget(instance string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, instance)
}
