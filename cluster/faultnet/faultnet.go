// Package faultnet is a fault-injecting network for in-process cluster tests.
// It plugs into cluster's two seams, Config.Listener and Config.Dial, and
// controls every connection a node dials: partitions (one-way or both ways,
// per node pair), added latency with jitter, and connection resets, all
// drawn from a seeded source so a failing schedule replays.
//
// Faults are applied on the dialing side, which sees both directions of the
// connection: Write carries from→to bytes, Read carries to→from bytes. A
// partition black-holes bytes like a real network does (the sender's write
// succeeds, nothing arrives, the peer's read deadline fires); it does not
// splice streams, so a connection that lost bytes is "poisoned" and closed
// when its link heals, exactly as a stalled TCP connection eventually breaks.
// Dials across a cut link wait for the heal or the dialer's deadline (SYNs
// into a black hole), so recovery after Heal is immediate.
package faultnet

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"slices"
	"sync"
	"time"
)

// ErrReset is returned by a connection the network reset (see SetResetRate).
var ErrReset = errors.New("faultnet: connection reset by fault injection")

// Link names one direction between two nodes.
type Link struct{ From, To string }

// rule is the fault configuration of one direction.
type rule struct {
	cut       bool
	delay     time.Duration
	jitter    time.Duration
	resetRate float64 // probability per Write that the connection is reset
}

func (r rule) zero() bool { return r == rule{} }

// Stats counts what the network did.
type Stats struct {
	Dials         uint64 // connections dialed between registered nodes
	DialsBlocked  uint64 // dials that waited on a cut link
	DialsFailed   uint64 // dials that gave up (deadline) on a cut link
	BytesDropped  uint64 // bytes black-holed by cuts
	WritesDelayed uint64
	Resets        uint64 // connections reset by SetResetRate
	Poisoned      uint64 // connections closed at heal because they lost bytes
}

// Network is a set of nodes and the faults between them. The zero value is
// not usable; call New.
type Network struct {
	mu      sync.Mutex
	rng     *rand.Rand
	nodes   map[string]string // advertised address → node id
	rules   map[Link]rule
	conns   map[*conn]struct{}
	changed chan struct{} // closed and replaced at every rule change
	stats   Stats
}

// New returns a healthy network whose random choices (jitter, resets) come
// from seed.
func New(seed int64) *Network {
	return &Network{
		rng:     rand.New(rand.NewSource(seed)),
		nodes:   make(map[string]string),
		rules:   make(map[Link]rule),
		conns:   make(map[*conn]struct{}),
		changed: make(chan struct{}),
	}
}

// Listen binds a loopback port for node and registers its address. Pass the
// listener as cluster.Config.Listener and its address as BindAddr/Peers.
func (n *Network) Listen(node string) (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultnet: listen for %s: %w", node, err)
	}
	n.Register(node, ln.Addr().String())
	return ln, nil
}

// ListenAt rebinds a known address (a node restarting on its old port).
func (n *Network) ListenAt(node, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("faultnet: listen for %s at %s: %w", node, addr, err)
	}
	n.Register(node, addr)
	return ln, nil
}

// Register maps an address to a node so dials to it are subject to faults.
func (n *Network) Register(node, addr string) {
	n.mu.Lock()
	n.nodes[addr] = node
	n.mu.Unlock()
}

// Dialer returns node's dial function (cluster.Config.Dial). Dials to
// addresses not registered pass through without faults.
func (n *Network) Dialer(node string) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		return n.dial(ctx, node, addr)
	}
}

func (n *Network) dial(ctx context.Context, from, addr string) (net.Conn, error) {
	n.mu.Lock()
	to, known := n.nodes[addr]
	if known {
		n.stats.Dials++
	}
	blocked := false
	for known && n.rules[Link{from, to}].cut || known && n.rules[Link{to, from}].cut {
		// A SYN (or its SYN-ACK) into a black hole: wait for a heal.
		if !blocked {
			blocked = true
			n.stats.DialsBlocked++
		}
		ch := n.changed
		n.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			n.mu.Lock()
			n.stats.DialsFailed++
			n.mu.Unlock()
			return nil, fmt.Errorf("faultnet: dial %s→%s (%s): link cut: %w", from, to, addr, ctx.Err())
		}
		n.mu.Lock()
	}
	n.mu.Unlock()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil || !known {
		return raw, err
	}
	c := &conn{Conn: raw, net: n, link: Link{from, to}}
	n.mu.Lock()
	n.conns[c] = struct{}{}
	n.mu.Unlock()
	return c, nil
}

// update changes rules under the lock, wakes blocked dialers and closes
// connections that lost bytes on links that are no longer cut.
func (n *Network) update(fn func()) {
	n.mu.Lock()
	fn()
	close(n.changed)
	n.changed = make(chan struct{})
	var doomed []*conn
	for c := range n.conns {
		c.mu.Lock()
		out := c.poisonedOut && !n.rules[c.link].cut
		in := c.poisonedIn && !n.rules[Link{c.link.To, c.link.From}].cut
		if out || in {
			c.closed = true // later writes fail instead of vanishing
		}
		c.mu.Unlock()
		if out || in {
			doomed = append(doomed, c)
			delete(n.conns, c)
			n.stats.Poisoned++
		}
	}
	n.mu.Unlock()
	for _, c := range doomed {
		c.Conn.Close()
	}
}

func (n *Network) set(l Link, fn func(*rule)) {
	r := n.rules[l]
	fn(&r)
	if r.zero() {
		delete(n.rules, l)
	} else {
		n.rules[l] = r
	}
}

// Cut black-holes traffic from → to (one way).
func (n *Network) Cut(from, to string) {
	n.update(func() { n.set(Link{from, to}, func(r *rule) { r.cut = true }) })
}

// Partition cuts both directions between a and b.
func (n *Network) Partition(a, b string) {
	n.update(func() {
		n.set(Link{a, b}, func(r *rule) { r.cut = true })
		n.set(Link{b, a}, func(r *rule) { r.cut = true })
	})
}

// Isolate cuts node off from every other registered node, both ways.
func (n *Network) Isolate(node string) {
	n.update(func() {
		for _, other := range n.nodeIDsLocked() {
			if other != node {
				n.set(Link{node, other}, func(r *rule) { r.cut = true })
				n.set(Link{other, node}, func(r *rule) { r.cut = true })
			}
		}
	})
}

// HealLink restores from → to (delays and resets stay).
func (n *Network) HealLink(from, to string) {
	n.update(func() { n.set(Link{from, to}, func(r *rule) { r.cut = false }) })
}

// Heal removes every fault: cuts, delays and resets.
func (n *Network) Heal() {
	n.update(func() { clear(n.rules) })
}

// SetDelay adds latency base + uniform[0, jitter) to every write from → to.
func (n *Network) SetDelay(from, to string, base, jitter time.Duration) {
	n.update(func() {
		n.set(Link{from, to}, func(r *rule) { r.delay, r.jitter = base, jitter })
	})
}

// SetDelayAll applies SetDelay to every ordered pair of registered nodes.
func (n *Network) SetDelayAll(base, jitter time.Duration) {
	n.update(func() {
		ids := n.nodeIDsLocked()
		for _, a := range ids {
			for _, b := range ids {
				if a != b {
					n.set(Link{a, b}, func(r *rule) { r.delay, r.jitter = base, jitter })
				}
			}
		}
	})
}

// SetResetRate makes each write from → to reset its connection with
// probability p (the in-flight bytes are lost and both ends see an error,
// as after a lost packet that broke the connection).
func (n *Network) SetResetRate(from, to string, p float64) {
	n.update(func() { n.set(Link{from, to}, func(r *rule) { r.resetRate = p }) })
}

// Cuts lists the directions currently cut.
func (n *Network) Cuts() []Link {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []Link
	for l, r := range n.rules {
		if r.cut {
			out = append(out, l)
		}
	}
	return out
}

// Stats returns counters since New.
func (n *Network) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stats
}

// Nodes lists registered node ids (sorted, without duplicates).
func (n *Network) Nodes() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.nodeIDsLocked()
}

func (n *Network) nodeIDsLocked() []string {
	seen := map[string]bool{}
	var ids []string
	for _, id := range n.nodes {
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// draw takes jitter and reset decisions from the seeded source under the lock.
func (n *Network) draw(r rule) (delay time.Duration, reset bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delay = r.delay
	if r.jitter > 0 {
		delay += time.Duration(n.rng.Int63n(int64(r.jitter)))
	}
	if r.resetRate > 0 && n.rng.Float64() < r.resetRate {
		reset = true
		n.stats.Resets++
	}
	if delay > 0 {
		n.stats.WritesDelayed++
	}
	return delay, reset
}

func (n *Network) rule(l Link) rule {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.rules[l]
}

func (n *Network) dropped(b int) {
	n.mu.Lock()
	n.stats.BytesDropped += uint64(b)
	n.mu.Unlock()
}

func (n *Network) forget(c *conn) {
	n.mu.Lock()
	delete(n.conns, c)
	n.mu.Unlock()
}

// conn is a dialed connection under the network's faults.
type conn struct {
	net.Conn
	net  *Network
	link Link // dialer → listener

	mu            sync.Mutex
	poisonedOut   bool // bytes from→to were dropped
	poisonedIn    bool // bytes to→from were dropped
	writeDeadline time.Time
	closed        bool
}

func (c *conn) Write(p []byte) (int, error) {
	r := c.net.rule(c.link)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, net.ErrClosed
	}
	poisoned := c.poisonedOut
	if r.cut {
		c.poisonedOut = true
	}
	deadline := c.writeDeadline
	c.mu.Unlock()
	if r.cut || poisoned {
		c.net.dropped(len(p))
		return len(p), nil
	}
	delay, reset := c.net.draw(r)
	if reset {
		c.Close()
		return 0, fmt.Errorf("faultnet: write %s→%s: %w", c.link.From, c.link.To, ErrReset)
	}
	if delay > 0 {
		if !deadline.IsZero() && time.Until(deadline) < delay {
			delay = max(time.Until(deadline), 0)
		}
		timer := time.NewTimer(delay)
		<-timer.C
	}
	return c.Conn.Write(p)
}

func (c *conn) Read(p []byte) (int, error) {
	back := Link{c.link.To, c.link.From}
	for {
		nr, err := c.Conn.Read(p)
		if nr == 0 {
			return nr, err
		}
		cut := c.net.rule(back).cut
		c.mu.Lock()
		if cut {
			c.poisonedIn = true
		}
		poisoned := c.poisonedIn
		c.mu.Unlock()
		if !poisoned {
			return nr, err
		}
		c.net.dropped(nr)
		if err != nil {
			return 0, err
		}
	}
}

func (c *conn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.writeDeadline = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

func (c *conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.writeDeadline = t
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

func (c *conn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.net.forget(c)
	return c.Conn.Close()
}
