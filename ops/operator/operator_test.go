package operator

import (
	"context"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/test/clustertest"
	"github.com/tether-project/tether/test/edgetest"
	"github.com/tether-project/tether/test/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

const testToken = "operator-test-admin-token-0123"

// startEdge runs one real edge (a single-voter Raft cluster on loopback,
// bbolt data dir) whose admin API the client talks to. Its workers are
// static URLs nobody serves: the admin API does not need them.
func startEdge(t *testing.T) *edge.Edge {
	t.Helper()
	g := edgetest.StartGroup(t, edgetest.GroupOptions{
		Options: clustertest.Options{N: 1, ID: func(int) string { return "edge-1" }},
		Config: func(int, clustertest.Member) edge.Config {
			cfg := edge.DefaultConfig()
			cfg.Model = "m"
			cfg.Port = 0
			cfg.AdminToken = testToken
			cfg.InternalRequestAuthKey = "operator-test-internal-key-0123"
			cfg.ContextServers.URLs = []edge.StaticInstance{{Name: "ctx-1", URL: "http://127.0.0.1:9"}}
			cfg.GenerationServers.URLs = []edge.StaticInstance{{Name: "gen-1", URL: "http://127.0.0.1:7"}}
			cfg.Leader.Interval = 20 * time.Millisecond
			cfg.Cluster.ProposeTimeout = 2 * time.Second
			cfg.Cluster.Raft = cluster.RaftTiming{HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond, LeaderLeaseTimeout: 50 * time.Millisecond}
			return cfg
		},
		Deps: func(int, clustertest.Member) edge.Deps {
			return edge.Deps{Logger: slog.New(slog.DiscardHandler), Version: "v-test"}
		},
		StartTimeout:  20 * time.Second,
		LeaderTimeout: 10 * time.Second,
	})
	return g.Node(0).Edge
}

func newClient(t *testing.T, token string, urls ...string) *Client {
	t.Helper()
	c, err := New(urls, token, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestNewRejectsBadArguments(t *testing.T) {
	for _, tc := range []struct {
		edges []string
		token string
		want  string
	}{
		{nil, testToken, "no edge URL"},
		{[]string{"127.0.0.1:8000"}, testToken, "not an absolute http(s) URL"},
		{[]string{"ftp://x:1"}, testToken, "not an absolute http(s) URL"},
		{[]string{"http://127.0.0.1:8000"}, "", "no admin token"},
	} {
		if _, err := New(tc.edges, tc.token, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%v, %q): %v, want %q", tc.edges, tc.token, err, tc.want)
		}
	}
}

func TestAdminAPIThroughTheClient(t *testing.T) {
	e := startEdge(t)
	url := "http://" + e.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// A wrong token is the API's own 401, decoded.
	_, _, err := newClient(t, "wrong-token-0123456789", url).Cluster(ctx)
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized || ae.Type != "authentication_error" || ae.Code != "unauthorized" {
		t.Fatalf("wrong token: %v", err)
	}
	// An unreachable first edge is skipped.
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadURL := "http://" + dead.Addr().String()
	dead.Close()
	c := newClient(t, testToken, deadURL, url)
	pl, err := c.ListPeers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pl.Edge != url || pl.Leader != "edge-1" || len(pl.Peers) != 1 || !pl.Peers[0].Voter {
		t.Fatalf("list-peers: %+v", pl)
	}

	if _, err := e.Node().Propose(ctx, fsm.Bind{Fleet: fsm.FleetContext, Key: "conv-1", ConversationID: "conv-1", Instance: "ctx-1",
		Decision: fsm.Decision{Edge: "edge-1", Policy: "test"}}); err != nil {
		t.Fatal(err)
	}
	c = newClient(t, testToken, url)
	b, found, err := c.Binding(ctx, fsm.FleetContext, "conv-1")
	if err != nil || !found || b.Instance != "ctx-1" || b.Epoch == 0 {
		t.Fatalf("binding: %+v %v %v", b, found, err)
	}
	if _, found, err := c.Binding(ctx, fsm.FleetContext, "no such/key"); err != nil || found {
		t.Fatalf("missing binding: found %v, err %v", found, err)
	}
	st := e.Node().State()
	h, err := c.StateHash(ctx, st.Index())
	if want := st.Hash(); err != nil || h.Index != st.Index() || h.NodeID != "edge-1" || h.Hash != hex.EncodeToString(want[:]) {
		t.Fatalf("state hash: %+v %v; the edge is at %d", h, err, st.Index())
	}

	// Membership errors are the cluster's, passed on.
	if _, err := c.RemovePeer(ctx, ""); err == nil {
		t.Fatal("remove-peer without an id succeeded")
	}
	if _, err := c.AddVoter(ctx, "edge-9", "not-an-address"); err == nil || !strings.Contains(err.Error(), "host:port") {
		t.Fatalf("add-voter with a bad address: %v", err)
	}

	// save → inspect → restore.
	// The leader may commit entries of its own meanwhile (make test under
	// load: the state moved on between the save and the check), so the
	// snapshot's index lies between the state's index before and after.
	path := filepath.Join(t.TempDir(), "s.snap")
	before := e.Node().State().Index()
	info, err := c.SaveSnapshot(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if after := e.Node().State().Index(); info.Index < before || info.Index > after || info.Term == 0 || info.Bindings != 1 {
		t.Fatalf("save: %+v; the state's index was %d before, %d after", info, before, after)
	}
	rep, err := InspectSnapshot(path)
	if err != nil || rep.Term != info.Term || rep.Summary.Hash != info.Hash || rep.Summary.PerInstance[0].Instance != "ctx-1" {
		t.Fatalf("inspect: %+v %v", rep, err)
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("the download's temporary file is left behind: %v", err)
	}
	res, err := c.RestoreSnapshot(ctx, path)
	if err != nil || res.Bindings != 1 {
		t.Fatalf("restore: %+v %v", res, err)
	}

	// A snapshot of the Raft store (what the node writes itself) inspects
	// too, with its term and Raft index from meta.json.
	if err := e.Node().Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	dirs, _ := filepath.Glob(filepath.Join(e.Node().Archive().Path(), "..", "snapshots", "snapshots", "*"))
	if len(dirs) == 0 {
		t.Fatal("no snapshot in the raft store")
	}
	rep, err = InspectSnapshot(dirs[len(dirs)-1])
	if err != nil || rep.Term == 0 || rep.RaftIndex == 0 || rep.Summary.Bindings != 1 {
		t.Fatalf("inspect a raft store snapshot: %+v %v", rep, err)
	}
	if _, err := InspectSnapshot(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Fatal("inspect of a missing file succeeded")
	}
}
