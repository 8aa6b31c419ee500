package transport

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/test/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// leaderHandler answers as a leader would: proposals get one applied result
// each at index 7, unless fail is set; membership changes are recorded.
type leaderHandler struct {
	mu      sync.Mutex
	fail    error
	got     []fsm.Proposal
	changes []string
	removed []string
}

func (h *leaderHandler) Propose(_ context.Context, props []fsm.Proposal) (uint64, []fsm.Result, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fail != nil {
		return 0, nil, h.fail
	}
	h.got = append(h.got, props...)
	out := make([]fsm.Result, len(props))
	for i := range out {
		out[i] = fsm.Result{Status: fsm.StatusApplied, Created: true}
	}
	return 7, out, nil
}

func (h *leaderHandler) ChangeMembership(_ context.Context, op Op, id, addr string, forwarded bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.changes = append(h.changes, op.String()+" "+id+" "+addr)
	if !forwarded {
		return BadRequest("want forwarded")
	}
	return nil
}

func (h *leaderHandler) Status(context.Context) ([]byte, error) {
	return json.Marshal(map[string]string{"id": "n0"})
}

func (h *leaderHandler) Removed(_ context.Context, peerID, id string, index uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.removed = append(h.removed, peerID+" "+id)
	return nil
}

// seen copies what the handler was given.
func (h *leaderHandler) seen() ([]fsm.Proposal, []string, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]fsm.Proposal(nil), h.got...), append([]string(nil), h.changes...), append([]string(nil), h.removed...)
}

func newTransport(t *testing.T, id string, key []byte) *Transport {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := New(Config{Listener: ln, Advertise: ln.Addr().String(), AuthKey: key, SelfID: id,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(tr.Close)
	return tr
}

// The seam: a follower's client reaches the leader's Handler with decoded
// values, and the Handler's answers and errors come back as the same
// values and sentinels.
func TestForwardingThroughTheHandler(t *testing.T) {
	h := &leaderHandler{}
	leader := newTransport(t, "n0", testKey)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leader.Serve(ctx, h)
	addr := leader.StreamLayer().Addr().String()
	client := newTransport(t, "n1", testKey).Client()

	bind, err := fsm.EncodeEvent(fsm.Bind{Fleet: fsm.FleetContext, Key: "k", Instance: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	// The middle event is of a type this build cannot decode: rejected by
	// the transport, never shown to the Handler; the others go ahead.
	index, results, err := client.Propose(cctx, addr, []fsm.ProposalID{{1}, {2}, {3}}, [][]byte{bind, {0x41, 1, 2}, bind})
	if err != nil || index != 7 || len(results) != 3 {
		t.Fatalf("propose: index %d, %d results, %v", index, len(results), err)
	}
	if results[0].Status != fsm.StatusApplied || results[1].Status != fsm.StatusRejected || results[2].Status != fsm.StatusApplied {
		t.Fatalf("statuses %v %v %v, want applied, rejected, applied", results[0].Status, results[1].Status, results[2].Status)
	}
	if got, _, _ := h.seen(); len(got) != 2 || got[0].ID != (fsm.ProposalID{1}) || got[1].ID != (fsm.ProposalID{3}) {
		t.Fatalf("the handler got %+v", got)
	}

	if err := client.ChangeMembership(cctx, addr, OpAddVoter, "n2", "10.0.0.2:7400", true); err != nil {
		t.Fatal(err)
	}
	if err := client.ChangeMembership(cctx, addr, OpRemove, "n2", "", false); err == nil || !strings.Contains(err.Error(), "bad request: want forwarded") {
		t.Fatalf("a BadRequest answer: %v", err)
	}
	if err := client.NotifyRemoved(cctx, addr, "n1", 9); err != nil {
		t.Fatal(err)
	}
	if b, err := client.Status(cctx, addr); err != nil || !strings.Contains(string(b), `"n0"`) {
		t.Fatalf("status: %s, %v", b, err)
	}
	if _, changes, removed := h.seen(); len(changes) != 2 || changes[0] != "add voter n2 10.0.0.2:7400" || len(removed) != 1 || removed[0] != "n1 n1" {
		t.Fatalf("changes %q, removed %q", changes, removed)
	}

	for _, c := range []struct {
		fail error
		want error
	}{
		{&NotLeaderError{LeaderID: "n2", LeaderAddr: "10.0.0.2:7400"}, ErrNotLeader},
		{ErrHalted, ErrHalted},
		{ErrClosed, ErrClosed},
		{ErrUnavailable, ErrUnavailable},
	} {
		h.mu.Lock()
		h.fail = c.fail
		h.mu.Unlock()
		_, _, err := client.Propose(cctx, addr, []fsm.ProposalID{{4}}, [][]byte{bind})
		var re *RemoteError
		if !errors.As(err, &re) || !errors.Is(err, c.want) {
			t.Fatalf("handler error %v came back as %v", c.fail, err)
		}
		var nl *NotLeaderError
		if errors.As(err, &nl) && (nl.LeaderID != "n2" || nl.LeaderAddr != "10.0.0.2:7400") {
			t.Fatalf("leader hint lost: %+v", nl)
		}
	}

	// Another key: refused in the handshake, and not retryable.
	stranger := newTransport(t, "n9", []byte("another-key-0123456789abcdef")).Client()
	if _, err := stranger.Status(cctx, addr); !errors.Is(err, ErrAuth) {
		t.Fatalf("wrong key: %v, want ErrAuth", err)
	}
}

// Close returns with Raft's handlers of accepted connections still
// running; WaitRaftHandlers waits until each has closed its connection
// (the stores stay open until then).
func TestWaitRaftHandlersWaitsForTheHandlerToClose(t *testing.T) {
	server := newTransport(t, "n0", testKey)
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	server.Serve(sctx, &leaderHandler{})
	client := newTransport(t, "n1", testKey)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := server.StreamLayer().Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	out, err := client.StreamLayer().Dial(raft.ServerAddress(server.StreamLayer().Addr().String()), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	handler, ok := <-accepted
	if !ok {
		t.Fatal("no connection accepted")
	}
	server.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	waited := server.WaitRaftHandlers(ctx)
	cancel()
	if waited {
		t.Fatal("WaitRaftHandlers returned while the handler still held its connection")
	}
	handler.Close() // the handler returns
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if !server.WaitRaftHandlers(ctx) {
		t.Fatal("WaitRaftHandlers did not return after the handler closed its connection")
	}
}
