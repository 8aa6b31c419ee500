package cluster

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/cluster/transport"
	"github.com/tether-project/tether/fsm"
)

// intruder plays a Raft peer dialing the cluster's port: TCP (TLS when
// conf is set), the 'R' stream byte, then, when key is set, the Raft
// handshake claiming id.
type intruder struct {
	net.Listener
	conf *tls.Config
	key  []byte
	id   string
}

func (s intruder) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	conn, err := net.DialTimeout("tcp", string(addr), timeout)
	if err != nil {
		return nil, err
	}
	if s.conf != nil {
		c := s.conf.Clone()
		c.ServerName = "127.0.0.1"
		tc := tls.Client(conn, c)
		_ = tc.SetDeadline(time.Now().Add(timeout))
		if err := tc.Handshake(); err != nil {
			conn.Close()
			return nil, err
		}
		_ = tc.SetDeadline(time.Time{})
		conn = tc
	}
	if _, err := conn.Write([]byte{transport.StreamRaft}); err != nil {
		conn.Close()
		return nil, err
	}
	if s.key != nil {
		_ = conn.SetDeadline(time.Now().Add(timeout))
		rw := bufio.NewReadWriter(bufio.NewReader(conn), bufio.NewWriter(conn))
		if err := transport.ClientHandshake(rw, transport.StreamRaft, s.key, s.id); err != nil {
			conn.Close()
			return nil, err
		}
		_ = conn.SetDeadline(time.Time{})
	}
	return conn, nil
}

// forgeAppend sends target an AppendEntries from a fake leader with a
// higher term, carrying a Bind of "forged", and reports whether the
// transport accepted it.
func forgeAppend(t *testing.T, target *Node, stream intruder) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stream.Listener = ln
	tr := raft.NewNetworkTransport(stream, 1, 3*time.Second, io.Discard)
	defer tr.Close()
	st := target.Status()
	data, err := fsm.EncodeEntry([]fsm.Proposal{{Event: fsm.Bind{Fleet: fsm.FleetContext, Key: "forged", Instance: "evil"}}})
	if err != nil {
		t.Fatal(err)
	}
	term := st.Term + 100
	req := &raft.AppendEntriesRequest{
		RPCHeader:         raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(stream.id), Addr: []byte(ln.Addr().String())},
		Term:              term,
		PrevLogEntry:      st.LastLogIndex,
		PrevLogTerm:       st.Term,
		Entries:           []*raft.Log{{Index: st.LastLogIndex + 1, Term: term, Type: raft.LogCommand, Data: data, AppendedAt: time.Now()}},
		LeaderCommitIndex: st.LastLogIndex + 1,
	}
	var resp raft.AppendEntriesResponse
	return tr.AppendEntries(raft.ServerID(target.ID()), raft.ServerAddress(target.Addr()), req, &resp)
}

// Without TLS, the AuthKey guards Raft streams as it guards
// forwarding. An AppendEntries from a peer that skips the handshake, or
// fails it, never reaches hashicorp/raft; the cluster goes on.
func TestRaftStreamRequiresTheAuthKey(t *testing.T) {
	t.Parallel()
	regs := map[string]*prometheus.Registry{}
	tc := newTestCluster(t, 3, func(i int, c *Config) {
		regs[c.NodeID] = prometheus.NewRegistry()
		c.Registerer = regs[c.NodeID]
	})
	target := tc.follower()
	failures := func() float64 {
		mfs, err := regs[target.ID()].Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "tether_cluster_auth_failures_total" && len(mf.GetMetric()) == 1 {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return 0
	}
	before := failures()
	for _, c := range []struct {
		name string
		s    intruder
	}{
		{"no handshake", intruder{id: "intruder"}},
		{"wrong key", intruder{id: "intruder", key: []byte("not-the-cluster-key-0123456789")}},
	} {
		err := forgeAppend(t, target, c.s)
		if err == nil {
			t.Fatalf("%s: the follower's transport accepted a forged AppendEntries", c.name)
		}
		t.Logf("%s: refused: %v", c.name, err)
	}
	// The server refuses on its own goroutine, possibly after the intruder
	// already gave up on the answer.
	waitFor(t, 10*time.Second, "both refusals counted", func() bool { return failures() >= before+2 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := target.Propose(ctx, bindEv("after-intruders", "w1")); err != nil {
		t.Fatalf("the cluster stopped serving: %v", err)
	}
	tc.sync(10 * time.Second)
	for _, n := range tc.running() {
		if _, ok := n.State().Lookup(fsm.FleetContext, "forged"); ok {
			t.Fatalf("node %s applied the forged binding", n.ID())
		}
	}
	assertSameState(t, tc)
}

// With mutual TLS, a certificate from the cluster's CA issued for another
// name cannot act as a node: not on a Raft stream, not on forwarding, not
// to join; and a node dialing a member refuses a server whose certificate
// names someone else.
func TestTLSPeerMustBeTheNodeItClaims(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, "tether-test-ca")
	tc := newTestCluster(t, 3, func(i int, c *Config) { c.TLS = ca.mutualTLS(t, c.NodeID) })
	target := tc.follower()
	workerURI, _ := url.Parse("spiffe://tether/worker/n1")
	// A worker's certificate from the same CA that even carries the DNS
	// name n1: its spiffe URI says worker, so it is not node n1.
	worker := ca.mutualTLSNamed(t, "n1", []*url.URL{workerURI}, []string{"n1"})
	other := ca.mutualTLS(t, "n9") // a real node certificate, for another node

	for _, c := range []struct {
		name string
		conf *tls.Config
		id   string
	}{
		{"worker certificate claiming n1", worker, "n1"},
		{"node n9's certificate claiming n1", other, "n1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := forgeAppend(t, target, intruder{conf: c.conf, key: testKey, id: c.id})
			if err == nil || !strings.Contains(err.Error(), "does not name node") {
				t.Fatalf("raft stream: %v, want a refusal naming the certificate mismatch", err)
			}
			conn, err := tlsDial(target.Addr(), c.conf, transport.StreamForward)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			rw := bufio.NewReadWriter(bufio.NewReader(conn), bufio.NewWriter(conn))
			if err := transport.ClientHandshake(rw, transport.StreamForward, testKey, c.id); !errors.Is(err, transport.ErrAuth) || !strings.Contains(err.Error(), "does not name node") {
				t.Fatalf("forwarding: %v, want refused", err)
			}
		})
	}

	t.Run("join under another name", func(t *testing.T) {
		err := tryJoin(t, "n7", target.Addr(), 10*time.Second, func(c *Config) { c.TLS = other })
		if err == nil {
			t.Fatal("a node joined as n7 with n9's certificate")
		}
		if !strings.Contains(err.Error(), "does not name node") {
			t.Fatalf("join refused for another reason: %v", err)
		}
	})

	t.Run("server with another name", func(t *testing.T) {
		// Something at a member's address presenting n9's certificate: a
		// node that expects n0 there refuses it before sending a byte.
		ln, err := tls.Listen("tcp", "127.0.0.1:0", other)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					_ = c.(*tls.Conn).Handshake()
					_, _ = io.Copy(io.Discard, c)
				}()
			}
		}()
		own, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		tr := transport.New(transport.Config{
			Listener: own, Advertise: own.Addr().String(), TLS: ca.mutualTLS(t, "n2"),
			AuthKey: testKey, SelfID: "n2", MemberAt: func(string) string { return "n0" }, Logger: testLogger(t),
		})
		defer tr.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = tr.Client().Status(ctx, ln.Addr().String())
		if !errors.Is(err, transport.ErrAuth) || !strings.Contains(err.Error(), `does not name node "n0"`) {
			t.Fatalf("dial to an impostor: %v", err)
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := target.Propose(ctx, bindEv("after-impostors", "w1")); err != nil {
		t.Fatalf("the cluster stopped serving: %v", err)
	}
	if peers := tc.leader(10 * time.Second).Status().Peers; len(peers) != 3 {
		t.Fatalf("membership changed: %+v", peers)
	}
}

func tlsDial(addr string, conf *tls.Config, kind byte) (net.Conn, error) {
	c := conf.Clone()
	c.ServerName = "127.0.0.1"
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, c)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write([]byte{kind}); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}
