// Package clustertest runs a group of Raft members in one test process: it
// reserves every member's ports first (so each knows its peers before any
// starts; besides its Raft port a member may have others, such as an edge's
// HTTP port), gives each a data directory, opens the members concurrently
// (all, or some while the others start later), waits for a ready leader,
// kills, closes and restarts a member on its data directory and addresses,
// and stops whatever is still running when the test ends (one after the
// other, leader first, or all at once), before the test's leak check.
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
	// Extra are the addresses of its other ports (Options.ExtraPorts).
	Extra []string
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
	// ExtraPorts is the number of other ports each member has besides the
	// one Listen opens (an edge's HTTP port): TCP on 127.0.0.1, reserved
	// with it and kept across restarts like it; open takes them with
	// Group.Listener.
	ExtraPorts int
	// CloseTimeout bounds each member's Close (0: 10 s).
	CloseTimeout time.Duration
	// ParallelClose closes the members at the end of the test all at once
	// instead of one after the other (a ready leader first each time).
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
	reserved [][]net.Listener // by member: ports not handed to it yet, its Raft port first
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

// Add reserves the ports and names the data directory of one more member,
// id (one that joins the group later); Start opens it. It returns the
// member's number.
func (g *Group[N]) Add(id string) (int, Member) {
	g.t.Helper()
	lns := make([]net.Listener, 1+g.o.ExtraPorts)
	var err error
	for p := range lns {
		if p == 0 {
			lns[p], err = g.o.Listen(id, "")
		} else {
			lns[p], err = listenTCP(id, "")
		}
		if err != nil {
			for _, ln := range lns[:p] {
				ln.Close()
			}
			g.t.Fatalf("clustertest: listen for %s: %v", id, err)
		}
	}
	m := Member{ID: id, Addr: lns[0].Addr().String(), DataDir: filepath.Join(g.base, id)}
	for _, ln := range lns[1:] {
		m.Extra = append(m.Extra, ln.Addr().String())
	}
	var zero N
	g.mu.Lock()
	defer g.mu.Unlock()
	g.members = append(g.members, m)
	g.reserved = append(g.reserved, lns)
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
	all := make([]int, g.Len())
	for i := range all {
		all[i] = i
	}
	g.StartSome(open, all...)
}

// StartSome is StartAll for the members numbered in which; the others keep
// their reserved ports until Start opens them (a bootstrap voter that
// starts later than its peers).
func (g *Group[N]) StartSome(open OpenFunc[N], which ...int) {
	g.t.Helper()
	g.mu.Lock()
	g.open = open
	g.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, len(which))
	for k, i := range which {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[k] = g.Start(i)
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

// Start opens member i with the function StartAll or StartSome got: the
// first time on the port reserved for it, after it stopped on its data
// directory and address again, as a restarted process would. A running
// member is returned as it is.
func (g *Group[N]) Start(i int) (N, error) {
	var zero N
	g.mu.Lock()
	m, up, n, open := g.members[i], g.up[i], g.nodes[i], g.open
	g.mu.Unlock()
	if up {
		return n, nil
	}
	if open == nil {
		return zero, fmt.Errorf("start %s: neither StartAll nor StartSome has run", m.ID)
	}
	ln, err := g.listener(i, 0)
	if err != nil {
		return zero, fmt.Errorf("start %s: %w", m.ID, err)
	}
	n, err = open(i, ln)
	if err != nil {
		return zero, fmt.Errorf("start %s: %w", m.ID, err)
	}
	g.set(i, n, true)
	return n, nil
}

// Listener is member i's extra port k (Options.ExtraPorts) for open to
// serve: the port reserved for it the first time, after that its address
// bound again. The listener is the caller's.
func (g *Group[N]) Listener(i, k int) (net.Listener, error) {
	return g.listener(i, 1+k)
}

// listener hands out member i's port p (0: the one Listen opens): the
// reserved one if it was not handed out yet, else its address bound again.
// The address of a member just stopped is released by the kernel
// asynchronously, so binding it again is retried for a while.
func (g *Group[N]) listener(i, p int) (net.Listener, error) {
	g.mu.Lock()
	m, ln := g.members[i], g.reserved[i][p]
	g.reserved[i][p] = nil
	g.mu.Unlock()
	if ln != nil {
		return ln, nil
	}
	addr, listen := m.Addr, g.o.Listen
	if p > 0 {
		addr, listen = m.Extra[p-1], listenTCP
	}
	err := waitfor.Err(10*time.Second, func() error {
		var err error
		ln, err = listen(m.ID, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}

// CloseAll stops every running member gracefully and releases the ports
// not handed out; the test's cleanup calls it. One after the other, it
// closes a ready leader first each time, so that each close hands
// leadership to a member still up.
func (g *Group[N]) CloseAll() {
	g.mu.Lock()
	for _, lns := range g.reserved {
		for p, ln := range lns {
			if ln != nil {
				ln.Close()
				lns[p] = nil
			}
		}
	}
	g.mu.Unlock()
	if !g.o.ParallelClose {
		for i := g.nextToClose(); i >= 0; i = g.nextToClose() {
			if err := g.Close(i); err != nil {
				g.t.Errorf("clustertest: %v", err)
			}
		}
		return
	}
	var wg sync.WaitGroup
	for i := range g.Len() {
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

// nextToClose is the member number of a running ready leader, else of the
// first running member, or -1.
func (g *Group[N]) nextToClose() int {
	if i := g.LeaderIndex(); i >= 0 {
		return i
	}
	for i := range g.Len() {
		if g.Up(i) {
			return i
		}
	}
	return -1
}
