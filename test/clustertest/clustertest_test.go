package clustertest

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
)

// fakeNode serves nothing: it holds its ports and records its close.
type fakeNode struct {
	id     string
	leader bool
	lns    []net.Listener
	log    *closeLog
}

type closeLog struct {
	mu  sync.Mutex
	ids []string
}

func (n *fakeNode) IsLeader() bool { return n.leader }

func (n *fakeNode) Kill() error {
	for _, ln := range n.lns {
		ln.Close()
	}
	return nil
}

func (n *fakeNode) Close(context.Context) error {
	n.log.mu.Lock()
	n.log.ids = append(n.log.ids, n.id)
	n.log.mu.Unlock()
	return n.Kill()
}

// Some members start later than the others, every port is kept across a
// restart, and the members still running at the end close leader first.
func TestGroupPortsStartSomeAndCloseOrder(t *testing.T) {
	log := &closeLog{}
	g := New[*fakeNode](t, Options{N: 3, ExtraPorts: 1})
	open := func(i int, ln net.Listener) (*fakeNode, error) {
		extra, err := g.Listener(i, 0)
		if err != nil {
			ln.Close()
			return nil, err
		}
		return &fakeNode{id: g.Member(i).ID, leader: i == 1, lns: []net.Listener{ln, extra}, log: log}, nil
	}
	addrs := func(n *fakeNode) []string {
		return []string{n.lns[0].Addr().String(), n.lns[1].Addr().String()}
	}
	want := func(i int) []string { m := g.Member(i); return append([]string{m.Addr}, m.Extra...) }

	g.StartSome(open, 0, 1)
	if !g.Up(0) || !g.Up(1) || g.Up(2) {
		t.Fatalf("up: %v %v %v, want members 0 and 1 only", g.Up(0), g.Up(1), g.Up(2))
	}
	if got := g.LeaderIndex(); got != 1 {
		t.Fatalf("leader %d, want 1", got)
	}
	n, err := g.Start(2)
	if err != nil {
		t.Fatal(err)
	}
	if got := addrs(n); !slices.Equal(got, want(2)) {
		t.Fatalf("member 2 started late on %v, want its reserved %v", got, want(2))
	}
	if err := g.Close(0); err != nil {
		t.Fatal(err)
	}
	if n, err = g.Start(0); err != nil {
		t.Fatal(err)
	}
	if got := addrs(n); !slices.Equal(got, want(0)) {
		t.Fatalf("member 0 restarted on %v, want %v", got, want(0))
	}
	log.ids = nil
	g.CloseAll()
	if want := []string{"n1", "n0", "n2"}; !slices.Equal(log.ids, want) {
		t.Fatalf("closed %v, want %v (the leader first)", log.ids, want)
	}
}
