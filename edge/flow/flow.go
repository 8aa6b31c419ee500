// Package flow is an edge's flow control: fair admission across tenants,
// for the whole fleet. Each instance's in-flight work is kept near what
// keeps it busy (what it reports running plus flow_control.queue_per_rank
// waiting per rank); the requests beyond wait in a bounded queue at the
// edge instead of piling up in the engines' first-come queues, and leave
// it in fair order: the highest band first (interactive, then batch), and
// within a band the tenant with the least service over the fleet (virtual
// time: each tenant's dispatched cost, decayed over a window, summed over
// every edge). The edges tell each other their queued requests and
// service over NATS (tether.v1.flow.<edge>), not through the log, so each
// orders by the same fleet-wide figures and holds back while another
// edge has a less served tenant waiting. A request that would wait beyond
// its band's bound is shed: 429 rate_limit_error (529 overloaded_error on
// /v1/messages) with a Retry-After computed from the fleet's measured
// drain rate. See edge/DESIGN.md "Fair admission across the fleet".
package flow

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/routing"
)

// Edge is what flow control asks of the edge.
type Edge interface {
	// Headroom is how many more requests model's fleets can start now:
	// over the fleet with the least, the sum over its healthy instances
	// of what each may still take before its queue passes
	// flow_control.queue_per_rank per rank (Headroom below; Unlimited
	// when no instance of the fleet reports its load).
	Headroom(model string, now time.Time) int
	// NATS is the edge's connection (nil: none, and each edge orders by
	// its own queue alone).
	NATS() *nats.Conn
	// Now is the edge's clock.
	Now() time.Time
}

// Request is one request as flow control sees it.
type Request struct {
	Model   string
	Tenant  string
	Band    Band
	Tokens  int // prompt tokens: the request's cost when fairness counts tokens
	Dialect apireq.Dialect
}

// Timing of the controller.
const (
	poll      = 5 * time.Millisecond   // a round while requests are queued here
	heartbeat = 250 * time.Millisecond // a state sent at least this often while there is one
	coalesce  = 20 * time.Millisecond  // a changed state waits at most this for the next
	// defaultYieldGrace is how long an edge holds back for a less served
	// tenant queued at another edge while the fleet has headroom: past it,
	// the other edge did not take it (gone, slow, its state stale) and this
	// edge serves its own queue. Longer than settle, during which that
	// edge still counts its own last release against the headroom.
	defaultYieldGrace = 3 * settle
	// requestCost is a request's fixed cost in tokens (fairness: tokens):
	// what a prefill step costs beyond its prompt, so requests of a few
	// tokens are not free.
	requestCost = 128
	// Retry-After bounds: at least a scheduling round or two; at most
	// what every agent SDK honors (openai-python's _base_client.py honors
	// up to MAX_RETRY_AFTER_DELAY, two minutes in current releases and
	// sixty seconds in older ones; beyond it the SDK does not retry).
	minRetryAfter = 250 * time.Millisecond
	maxRetryAfter = 60 * time.Second
	// maxTenantLabels bounds the tenant label of the metrics; further
	// tenants share "other".
	maxTenantLabels = 64
)

// Unlimited is the headroom of a fleet flow control does not limit.
const Unlimited = math.MaxInt32

// Controller is an edge's flow control. Admit every inference request
// through it; run Run while the edge runs.
type Controller struct {
	cfg       config.FlowConfig
	edge      Edge
	nodeID    string
	m         *observe.FlowMetrics
	log       *slog.Logger
	tenantKey []byte

	wake chan struct{}
	done chan struct{}
	// yieldGrace is defaultYieldGrace; tests that judge who gets the room
	// on a starved host give the other edge longer to take it.
	yieldGrace time.Duration

	mu     sync.Mutex
	models map[string]*queue
	peers  peers
	labels map[string]struct{}
	closed bool
	pub    publishing
	sub    *nats.Subscription
}

// publishing is the state of this edge's flow state messages.
type publishing struct {
	dirty    bool
	last     time.Time
	seq      uint64
	nonEmpty bool // the last state sent held flows
}

// New is the flow control of the edge nodeID under cfg; internalKey (the
// internal request auth key, shared by the edges) keys the hashes of API
// keys that name tenants.
func New(cfg config.FlowConfig, nodeID string, internalKey []byte, edge Edge, m *observe.FlowMetrics, log *slog.Logger) *Controller {
	mac := hmac.New(sha256.New, []byte("tether flow tenant"))
	mac.Write(internalKey)
	return &Controller{cfg: cfg, edge: edge, nodeID: nodeID, m: m, log: log, tenantKey: mac.Sum(nil),
		wake: make(chan struct{}, 1), done: make(chan struct{}), yieldGrace: defaultYieldGrace,
		models: map[string]*queue{}, peers: peers{}, labels: map[string]struct{}{}}
}

// Enabled reports whether requests may wait and be shed (flow_control.enabled);
// off, Admit only counts them.
func (c *Controller) Enabled() bool { return c.cfg.Enabled }

// Tenant is the tenant of a request with headers h (the trust boundary
// already applied): flow_control.tenant_header, else "key-" and a keyed
// hash of its API key (Authorization: Bearer, x-api-key; the key itself is
// never kept), else "default". A malformed tenant header is a 400 while
// flow control is on; off, it is ignored (requests are only counted).
func (c *Controller) Tenant(h http.Header) (string, *api.Error) {
	if v := strings.TrimSpace(h.Get(c.cfg.TenantHeader)); v != "" {
		err := telemetry.ValidTenant(v)
		if err == nil {
			return v, nil
		}
		if c.cfg.Enabled {
			return "", api.BadRequest("invalid_header", strings.ToLower(c.cfg.TenantHeader), "%v", err)
		}
	}
	key := strings.TrimSpace(h.Get("x-api-key"))
	if a := h.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		key = strings.TrimSpace(a[7:])
	}
	if key == "" {
		return "default", nil
	}
	mac := hmac.New(sha256.New, c.tenantKey)
	mac.Write([]byte(key))
	return "key-" + hex.EncodeToString(mac.Sum(nil)[:8]), nil
}

// BandOf is the band of a request of priority p (x-tether-priority) whose
// body says serviceTier (OpenAI's service_tier, raw JSON; "flex" is
// OpenAI's slower, cheaper processing): the header's band when it names
// one (batch for background), else batch for flex, else interactive.
func BandOf(p routing.Priority, serviceTier json.RawMessage) Band {
	switch p {
	case routing.PriorityBackground:
		return Batch
	case routing.PriorityInteractive:
		return Interactive
	}
	var tier string
	if json.Unmarshal(serviceTier, &tier) == nil && strings.EqualFold(strings.TrimSpace(tier), "flex") {
		return Batch
	}
	return Interactive
}

// Admit lets r through when the fleet has room for it and nothing is
// queued ahead of it; else it waits at the edge for its turn in fair
// order, at most its band's max_wait. It returns how long r waited, or
// the refusal to answer with (429/529 and Retry-After; 499 when ctx ended
// first).
func (c *Controller) Admit(ctx context.Context, r Request) (time.Duration, *api.Error) {
	now := c.edge.Now()
	k := flowKey{band: r.Band, tenant: r.Tenant}
	if !c.cfg.Enabled {
		label := c.label(r.Tenant)
		c.m.Served.WithLabelValues(k.band.String(), label).Inc()
		c.m.Wait.WithLabelValues(k.band.String(), label).Observe(0)
		return 0, nil
	}
	headroom := c.edge.Headroom(r.Model, now)
	c.mu.Lock()
	label := c.labelLocked(r.Tenant)
	if c.closed {
		c.mu.Unlock()
		return 0, closing()
	}
	q := c.queue(r.Model)
	others := c.peers.others(r.Model, now)
	cost := c.cost(r)
	if !q.backlogged(k.band, others) && headroom-q.pending(now) > 0 {
		q.charge(q.flow(k, now), cost, now)
		c.pub.dirty = true
		c.mu.Unlock()
		c.served(k.band, label, 0)
		return 0, nil
	}
	bc := c.band(k.band)
	if q.queued[k.band] >= bc.MaxQueued {
		drain := q.drain(k, others, now)
		c.mu.Unlock()
		return 0, c.shed(r, label, "queue_full", drain)
	}
	if est, ok := q.estimate(k, others, now); ok && est > bc.MaxWait {
		drain := q.drain(k, others, now)
		c.mu.Unlock()
		return 0, c.shed(r, label, "predicted_wait", drain)
	}
	w := q.push(k, cost, now, now.Add(bc.MaxWait))
	c.pub.dirty = true
	c.mu.Unlock()
	c.m.Queued.WithLabelValues(k.band.String(), label).Inc()
	c.signal()
	return c.await(ctx, q, w, r, label)
}

// await waits for w's release, its band's bound, ctx or the controller's
// end.
func (c *Controller) await(ctx context.Context, q *queue, w *waiter, r Request, label string) (time.Duration, *api.Error) {
	band := w.flow.key.band
	defer c.m.Queued.WithLabelValues(band.String(), label).Dec()
	bound := time.NewTimer(max(w.deadline.Sub(c.edge.Now()), 0))
	defer bound.Stop()
	var reason string
	select {
	case <-w.ready:
	case <-bound.C:
		reason = "wait_bound"
	case <-ctx.Done():
		reason = "gone"
	case <-c.done:
		reason = "closing"
	}
	now := c.edge.Now()
	c.mu.Lock()
	if w.state == released {
		c.mu.Unlock()
		waited := w.at.Sub(w.enq)
		c.served(band, label, waited)
		return waited, nil
	}
	q.remove(w)
	c.pub.dirty = true
	drain := q.drain(w.flow.key, c.peers.others(r.Model, now), now)
	c.mu.Unlock()
	switch reason {
	case "gone":
		return 0, api.NewError(api.StatusClientClosed, "invalid_request_error", "client_closed", "", "the client went away while the request waited")
	case "closing":
		return 0, closing()
	}
	return 0, c.shed(r, label, reason, drain)
}

// backlogged reports whether requests of band b or a higher one are
// queued here or at another edge.
func (q *queue) backlogged(b Band, others map[flowKey]peerFlow) bool {
	for x := Interactive; x <= b; x++ {
		if q.queued[x] > 0 {
			return true
		}
	}
	for k, o := range others {
		if k.band <= b && o.queued > 0 {
			return true
		}
	}
	return false
}

func (c *Controller) band(b Band) config.BandConfig {
	if b == Batch {
		return c.cfg.Batch
	}
	return c.cfg.Interactive
}

func (c *Controller) cost(r Request) float64 {
	if c.cfg.Fairness == config.FairnessRequests {
		return 1
	}
	return float64(max(r.Tokens, 0) + requestCost)
}

// queue is model's queue (created on first use); c.mu held.
func (c *Controller) queue(model string) *queue {
	q := c.models[model]
	if q == nil {
		q = newQueue()
		c.models[model] = q
	}
	return q
}

func (c *Controller) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *Controller) served(b Band, label string, waited time.Duration) {
	c.m.Served.WithLabelValues(b.String(), label).Inc()
	c.m.Wait.WithLabelValues(b.String(), label).Observe(waited.Seconds())
}

// shed counts r's refusal and returns it: 429 rate_limit_error, or 529
// overloaded_error on the Messages API (Anthropic's answer when it is
// overloaded), with Retry-After est (when the queue ahead of it will have
// drained: queue.drain; the band's bound while nothing was measured),
// spread by ±10 % so the refused do not come back at once, within the
// bounds the SDKs honor.
func (c *Controller) shed(r Request, label, reason string, est time.Duration) *api.Error {
	c.m.Shed.WithLabelValues(r.Band.String(), label, reason).Inc()
	if est <= 0 {
		est = c.band(r.Band).MaxWait
	}
	retry := time.Duration(float64(est) * (0.9 + 0.2*rand.Float64()))
	retry = min(max(retry, minRetryAfter), maxRetryAfter)
	status := http.StatusTooManyRequests
	if r.Dialect == apireq.Messages {
		status = 529
	}
	bound := c.band(r.Band).MaxWait
	why := map[string]string{
		"queue_full":     "the band's queue on this edge is full",
		"wait_bound":     "it waited the band's max_wait (" + bound.String() + ")",
		"predicted_wait": "at the fleet's measured rate it would wait longer than the band's max_wait (" + bound.String() + ")",
	}[reason]
	e := api.NewError(status, "rate_limit_error", "fleet_saturated", "",
		"the fleet is saturated and tenant %q's %s requests wait their turn: %s; the requests queued ahead of it will have left in about %s; retry after %s",
		r.Tenant, r.Band, why, est.Round(time.Millisecond), retry.Round(time.Millisecond))
	e.RetryAfter = retry
	return e
}

func closing() *api.Error {
	e := api.NewError(http.StatusServiceUnavailable, "server_error", "edge_closing", "", "this edge is shutting down; retry on another edge")
	e.RetryAfter = time.Second
	return e
}

// label is tenant's metrics label.
func (c *Controller) label(tenant string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.labelLocked(tenant)
}

// labelLocked is tenant's metrics label: the tenant itself for the first
// maxTenantLabels tenants (their series created at 0 on first sight, so
// shares and sheds read 0 rather than absent), "other" beyond; c.mu held.
func (c *Controller) labelLocked(tenant string) string {
	if _, ok := c.labels[tenant]; ok {
		return tenant
	}
	if len(c.labels) >= maxTenantLabels {
		return "other"
	}
	c.labels[tenant] = struct{}{}
	for b := Interactive; b < numBands; b++ {
		c.m.Served.WithLabelValues(b.String(), tenant)
		c.m.Queued.WithLabelValues(b.String(), tenant)
		c.m.Wait.WithLabelValues(b.String(), tenant)
		for _, r := range observe.FlowShedReasons {
			c.m.Shed.WithLabelValues(b.String(), tenant, r)
		}
	}
	return tenant
}
