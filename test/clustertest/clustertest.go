// Package clustertest runs a group of Raft members in one test process: it
// reserves every member's port first (so each knows its peers before any
// starts), gives each a data directory, opens the members concurrently,
// waits for a ready leader, kills, closes and restarts a member on its data
// directory and address, and stops whatever is still running when the test
// ends, before the test's leak check.
//
// It is generic over the member: a bare *cluster.Node (the cluster
// package's own tests, test/reliability) or a whole edge behind a small
// adapter. It does not import the cluster package, so that package's own
// tests can use it.
package clustertest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/test/waitfor"
)

// Node is what a Group needs of a running member. *cluster.Node has it.
type Node interface {
	// IsLeader reports whether the member is a ready leader.
	IsLeader() bool
	// Kill stops the member abruptly, as if its process died.
	Kill() error
	// Close stops the member gracefully.
	Close(ctx context.Context) error
}

// Member is one member's identity in the group.
type Member struct {
	ID string
	// Addr is the address of the member's port (its Raft address).
	Addr string
	// DataDir is the member's own directory below the test's temp dir
	// (not created).
	DataDir string
}

// Options shape a group.
type Options struct {
	// N is the number of members.
	N int
	// ID names member i (nil: "n<i>").
	ID func(i int) string
	// Listen opens member id's port at addr, or at a new address when addr
	// is "" (nil: TCP on 127.0.0.1).
	Listen func(id, addr string) (net.Listener, error)
	// CloseTimeout bounds each member's Close (0: 10 s).
	CloseTimeout time.Duration
	// ParallelClose closes the members at the end of the test all at once
	// instead of one after the other.
	ParallelClose bool
}

// OpenFunc opens member i on ln, its port: each time the member starts.
type OpenFunc[N Node] func(i int, ln net.Listener) (N, error)

// Group is a set of members, each running or down.
type Group[N Node] struct {
	t    testing.TB
	o    Options
	base string
	open OpenFunc[N]

	mu       sync.Mutex
	members  []Member
	reserved []net.Listener // ports not handed to a member yet
	nodes    []N
	up       []bool
}

func listenTCP(_, addr string) (net.Listener, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	return net.Listen("tcp", addr)
}

// New reserves the ports and names the data directories of o.N members;
// none runs until StartAll. What runs at the end of t is stopped.
func New[N Node](t testing.TB, o Options) *Group[N] {
	t.Helper()
	if o.ID == nil {
		o.ID = func(i int) string { return fmt.Sprintf("n%d", i) }
	}
	if o.Listen == nil {
		o.Listen = listenTCP
	}
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = 10 * time.Second
	}
	g := &Group[N]{t: t, o: o, base: t.TempDir()}
	t.Cleanup(g.CloseAll)
	for i := range o.N {
		g.Add(o.ID(i))
	}
	return g
}

// Add reserves a port and names the data directory of one more member,
// id (one that joins the group later); Start opens it. It returns the
// member's number.
func (g *Group[N]) Add(id string) (int, Member) {
	g.t.Helper()
	ln, err := g.o.Listen(id, "")
	if err != nil {
		g.t.Fatalf("clustertest: listen for %s: %v", id, err)
	}
	m := Member{ID: id, Addr: ln.Addr().String(), DataDir: filepath.Join(g.base, id)}
	var zero N
	g.mu.Lock()
	defer g.mu.Unlock()
	g.members = append(g.members, m)
	g.reserved = append(g.reserved, ln)
	g.nodes = append(g.nodes, zero)
	g.up = append(g.up, false)
	return len(g.members) - 1, m
}

// Members are the group's members, by number.
func (g *Group[N]) Members() []Member {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Member(nil), g.members...)
}

// Member is member i.
func (g *Group[N]) Member(i int) Member {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.members[i]
}

// Len is the number of members, running or down.
func (g *Group[N]) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.members)
}

// StartAll opens every member concurrently with open (which Start uses
// from then on) and fails the test if one does not open. It does not wait
// for a leader.
func (g *Group[N]) StartAll(open OpenFunc[N]) {
	g.t.Helper()
	g.mu.Lock()
	g.open = open
	n := len(g.members)
	g.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = g.Start(i)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		g.t.Fatalf("clustertest: %v", err)
	}
}

func (g *Group[N]) set(i int, n N, up bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.nodes[i], g.up[i] = n, up
}

// take marks member i down and returns what ran (ok false: it was down).
func (g *Group[N]) take(i int) (n N, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	n, ok = g.nodes[i], g.up[i]
	var zero N
	g.nodes[i], g.up[i] = zero, false
	return n, ok
}

// Node is member i while it runs (the zero N while it is down).
func (g *Group[N]) Node(i int) N {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.nodes[i]
}

// Up reports whether member i runs.
func (g *Group[N]) Up(i int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.up[i]
}

// Running are the members that run, by index.
func (g *Group[N]) Running() []N {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []N
	for i, n := range g.nodes {
		if g.up[i] {
			out = append(out, n)
		}
	}
	return out
}

// Index is the member number of n, or -1.
func (g *Group[N]) Index(n N) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, m := range g.nodes {
		if g.up[i] && any(m) == any(n) {
			return i
		}
	}
	return -1
}

// LeaderIndex is the member number of a running ready leader, or -1.
func (g *Group[N]) LeaderIndex() int {
	for i := range g.Len() {
		if g.Up(i) && g.Node(i).IsLeader() {
			return i
		}
	}
	return -1
}

// WaitLeader waits for a ready leader among the running members and
// returns its member number.
func (g *Group[N]) WaitLeader(timeout time.Duration) int {
	g.t.Helper()
	idx := -1
	waitfor.True(g.t, timeout, "a ready leader", func() bool {
		idx = g.LeaderIndex()
		return idx >= 0
	})
	return idx
}

// Kill stops member i abruptly (connections drop, no leadership
// transfer); a member that is down stays down.
func (g *Group[N]) Kill(i int) error {
	n, ok := g.take(i)
	if !ok {
		return nil
	}
	if err := n.Kill(); err != nil {
		return fmt.Errorf("kill %s: %w", g.Member(i).ID, err)
	}
	return nil
}

// Close stops member i gracefully; a member that is down stays down.
func (g *Group[N]) Close(i int) error {
	n, ok := g.take(i)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.o.CloseTimeout)
	defer cancel()
	if err := n.Close(ctx); err != nil {
		return fmt.Errorf("close %s: %w", g.Member(i).ID, err)
	}
	return nil
}

// Start opens member i with StartAll's function: the first time on the
// port reserved for it, after it stopped on its data directory and address
// again, as a restarted process would. A running member is returned as it
// is. The address of a member just stopped is released by the kernel
// asynchronously, so binding it again is retried for a while.
func (g *Group[N]) Start(i int) (N, error) {
	var zero N
	g.mu.Lock()
	m, ln, up, n, open := g.members[i], g.reserved[i], g.up[i], g.nodes[i], g.open
	if up {
		g.mu.Unlock()
		return n, nil
	}
	if open == nil {
		g.mu.Unlock()
		return zero, fmt.Errorf("start %s: StartAll has not run", m.ID)
	}
	g.reserved[i] = nil
	g.mu.Unlock()
	if ln == nil {
		err := waitfor.Err(10*time.Second, func() error {
			var err error
			ln, err = g.o.Listen(m.ID, m.Addr)
			return err
		})
		if err != nil {
			return zero, fmt.Errorf("start %s: listen on %s: %w", m.ID, m.Addr, err)
		}
	}
	n, err := open(i, ln)
	if err != nil {
		return zero, fmt.Errorf("start %s: %w", m.ID, err)
	}
	g.set(i, n, true)
	return n, nil
}

// CloseAll stops every running member gracefully and releases the ports
// not handed out; the test's cleanup calls it.
func (g *Group[N]) CloseAll() {
	g.mu.Lock()
	for i, ln := range g.reserved {
		if ln != nil {
			ln.Close()
			g.reserved[i] = nil
		}
	}
	g.mu.Unlock()
	var wg sync.WaitGroup
	for i := range g.Len() {
		if !g.o.ParallelClose {
			if err := g.Close(i); err != nil {
				g.t.Errorf("clustertest: %v", err)
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.Close(i); err != nil {
				g.t.Errorf("clustertest: %v", err)
			}
		}()
	}
	wg.Wait()
}
