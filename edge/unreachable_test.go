package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/respid"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/natstest"
)

// cutNet is the edge's hop transport with a switch per worker address: its
// connects refused (the port closed) or black-holed (the connect times
// out, as across a partition), while the worker itself, and its
// telemetry over NATS, go on.
type cutNet struct {
	tr     *http.Transport
	mu     sync.Mutex
	mode   map[string]string // address → "refuse" | "blackhole"
	onDial map[string]func() // address → called as a black-holed connect begins
}

// cutConnectTimeout stands for the hops' connect timeout (5 s) across a
// black hole.
const cutConnectTimeout = 300 * time.Millisecond

func newCutNet() *cutNet {
	n := &cutNet{mode: map[string]string{}, onDial: map[string]func(){}}
	d := &net.Dialer{Timeout: 5 * time.Second}
	n.tr = &http.Transport{MaxIdleConnsPerHost: 64, DialContext: fleetview.WatchDials(func(ctx context.Context, network, addr string) (net.Conn, error) {
		n.mu.Lock()
		m, hook := n.mode[addr], n.onDial[addr]
		n.mu.Unlock()
		switch m {
		case "refuse":
			return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
		case "blackhole":
			if hook != nil {
				hook()
			}
			t := time.NewTimer(cutConnectTimeout)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-t.C:
				return nil, &net.OpError{Op: "dial", Net: network, Err: os.ErrDeadlineExceeded}
			}
		}
		return d.DialContext(ctx, network, addr)
	})}
	return n
}

// cut switches w's connects ("": healed) and ends the kept-alive
// connections, as a closed port does; hook, when set, is called as each
// black-holed connect to w begins.
func (n *cutNet) cut(w *testWorker, mode string, hook func()) {
	n.cutKeepingConns(w, mode, hook)
	n.tr.CloseIdleConnections()
}

// cutKeepingConns is cut leaving the connections kept alive open, as a
// partition does (what is sent on them is never answered).
func (n *cutNet) cutKeepingConns(w *testWorker, mode string, hook func()) {
	n.mu.Lock()
	n.mode[w.proxy.Listener.Addr().String()] = mode
	n.onDial[w.proxy.Listener.Addr().String()] = hook
	n.mu.Unlock()
}

// An instance the edge cannot connect to while its telemetry keeps
// arriving: the first request there pays the failed connect and is retried
// elsewhere; from then on the instance is unreachable from this edge
// (gauge, admin view) and no request goes there — not the key bound to it
// (detoured through committed overflows), not a new one — though its
// telemetry says it is healthy. Healed, a probe clears the mark and the
// key's next turn is back on it. Requests pinned to an unreachable
// instance (a stored response's continuation) still try it, having
// nowhere else to go, and are answered 503 with Retry-After.
func TestUnreachableInstanceGetsNoRequests(t *testing.T) {
	ns := natstest.Start(t, nil)
	var ctxs, gens []*testWorker
	for i := range 2 {
		ctxs = append(ctxs, startWorker(t, fmt.Sprintf("ctx-%d", i), workerOpts{fleet: telemetry.FleetContext, role: hintauth.RoleContext, nats: ns.ClientURL()}))
		gens = append(gens, startWorker(t, fmt.Sprintf("gen-%d", i), workerOpts{fleet: telemetry.FleetGeneration, role: hintauth.RoleGeneration, nats: ns.ClientURL()}))
	}
	cn := newCutNet()
	ec := startEdgesDeferred(t, 1, ns.ClientURL(), nil, func(int) Deps { return Deps{Transport: cn.tr} })
	ec.waitInstances(4)
	te, c := ec.edge(0), httpClient(t)
	connects := func(fleet string) float64 {
		return counter(t, te.registry, "tether_edge_upstream_errors_total", map[string]string{"fleet": fleet, "kind": "connect"})
	}

	bound := &agent{session: "unreach-bound", system: longText("unreach", 24)}
	first := bound.send(t, c, te, "one", nil)
	var victim, other *testWorker
	for _, w := range ctxs {
		if w.id == first.ctxInst {
			victim = w
		} else {
			other = w
		}
	}
	cn.cut(victim, "refuse", nil)
	cutAt := time.Now()
	if r := bound.send(t, c, te, "two", nil); r.ctxInst != other.id || connects("context") != 1 {
		t.Fatalf("the bound key's turn after the cut: on %s, %v failed connects; want %s after one", r.ctxInst, connects("context"), other.id)
	}
	for i := range 4 {
		r := bound.send(t, c, te, fmt.Sprintf("turn-%d", i), nil)
		n := (&agent{session: fmt.Sprintf("unreach-new-%d", i), system: longText(fmt.Sprintf("new-%d", i), 24)}).send(t, c, te, "one", nil)
		if r.ctxInst == victim.id || n.ctxInst == victim.id {
			t.Fatalf("turn %d: a request on the unreachable %s (bound key on %s, new key on %s)", i, victim.id, r.ctxInst, n.ctxInst)
		}
	}
	if n := connects("context"); n != 1 {
		t.Fatalf("%v failed connects: requests still went to the unreachable instance", n)
	}
	unreachableOnEdge(t, te, c, victim.id, 1)
	waitFor(t, "the unreachable instance's telemetry still arriving", 10*time.Second, func() bool {
		in, _ := te.e.Fleet().Instance(victim.id, time.Now())
		return in.Telemetry && in.LastSeen.After(cutAt) && in.Unreachable
	})

	cn.cut(victim, "", nil)
	waitFor(t, "a probe clearing the mark after the heal", 10*time.Second, func() bool {
		in, _ := te.e.Fleet().Instance(victim.id, time.Now())
		return !in.Unreachable && in.Healthy
	})
	unreachableOnEdge(t, te, c, victim.id, 0)
	if r := bound.send(t, c, te, "healed", nil); r.ctxInst != victim.id {
		t.Fatalf("after the heal the bound key's turn is on %s, want %s", r.ctxInst, victim.id)
	}
	givenUpStillMarks(t, te, c, cn, bound, victim, connects)
	stalledKeptAliveMarks(t, te, c, cn, bound, victim, connects)

	pinnedStillTried(t, te, c, cn, gens, connects)
}

// pinnedStillTried: the generation instance holding a stored response is
// black-holed; each continuation still tries it (its only holder) and is
// answered 503 with Retry-After, while other requests go elsewhere
// without a connect; healed, the continuation is served.
func pinnedStillTried(t *testing.T, te *testEdge, c *http.Client, cn *cutNet, gens []*testWorker, connects func(string) float64) {
	t.Helper()
	r := do(t, c, "POST", te.url()+"/v1/responses", mustJSON(map[string]any{"model": testModel, "input": "keep me", "max_output_tokens": 4}), nil)
	var stored struct{ ID string }
	if r.status != http.StatusOK || json.Unmarshal(r.body, &stored) != nil {
		t.Fatalf("a stored response: %d %s", r.status, r.body)
	}
	ref, _ := respid.Decode(stored.ID)
	var holder *testWorker
	for _, w := range gens {
		if w.id == ref.Instance {
			holder = w
		}
	}
	if holder == nil {
		t.Fatalf("the response is held by %q, not a generation worker", ref.Instance)
	}
	cn.cut(holder, "blackhole", nil)
	before := connects("generation")
	continuation := mustJSON(map[string]any{"model": testModel, "input": "more", "previous_response_id": stored.ID, "max_output_tokens": 4})
	for i := range 2 {
		r := do(t, c, "POST", te.url()+"/v1/responses", continuation, nil)
		if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
			t.Fatalf("continuation %d with its holder cut: %d (Retry-After %q) %s", i, r.status, r.header.Get("Retry-After"), r.body)
		}
		if n := connects("generation"); n != before+float64(i+1) {
			t.Fatalf("continuation %d: %v failed connects since the cut, want %d: the pinned request must still try its holder", i, n-before, i+1)
		}
	}
	for i := range 4 {
		n := (&agent{session: fmt.Sprintf("unreach-gen-%d", i), system: longText(fmt.Sprintf("gen-%d", i), 24)}).send(t, c, te, "one", nil)
		if n.gen == holder.id {
			t.Fatalf("a new request's generation hop on the unreachable %s", holder.id)
		}
	}
	if n := connects("generation"); n != before+2 {
		t.Fatalf("%v failed generation connects since the cut, want the continuations' 2", n-before)
	}
	unreachableOnEdge(t, te, c, holder.id, 1)
	cn.cut(holder, "", nil)
	waitFor(t, "the holder reachable again", 10*time.Second, func() bool {
		in, _ := te.e.Fleet().Instance(holder.id, time.Now())
		return !in.Unreachable
	})
	if r := do(t, c, "POST", te.url()+"/v1/responses", continuation, nil); r.status != http.StatusOK {
		t.Fatalf("the continuation after the heal: %d %s", r.status, r.body)
	}
}

// unreachableOnEdge checks the edge's gauge for instance id and, when it
// is 1, the admin view's record of it.
func unreachableOnEdge(t *testing.T, te *testEdge, c *http.Client, id string, want float64) {
	t.Helper()
	if g := counter(t, te.registry, "tether_edge_instance_unreachable", map[string]string{"instance": id}); g != want {
		t.Fatalf("tether_edge_instance_unreachable{instance=%q} = %v, want %v", id, g, want)
	}
	var out struct{ Instances []admin.InstanceInfo }
	if err := json.Unmarshal(adminGet(t, c, te, "/admin/v1/instances").body, &out); err != nil {
		t.Fatal(err)
	}
	for _, in := range out.Instances {
		if in.ID != id {
			continue
		}
		if want == 1 && (!in.Unreachable || in.Healthy || in.UnreachableSince == nil || in.ConnectFailures < 1 || in.LastConnectError == "" || !in.Telemetry) {
			t.Fatalf("admin view of the unreachable %s: %+v", id, in)
		}
		if want == 0 && (in.Unreachable || in.UnreachableSince != nil) {
			t.Fatalf("admin view of the reachable %s: %+v", id, in)
		}
		return
	}
	t.Fatalf("no admin view of %s", id)
}

// givenUpStillMarks: the victim black-holed, the client of the first
// request sent there gives up while the edge connects (as clients whose
// timeout is shorter than the connect's do); the edge learns nothing from
// the cancelled hop, but the connect goes on, fails and marks the
// instance, and the key's next turn goes elsewhere without a connect.
func givenUpStillMarks(t *testing.T, te *testEdge, c *http.Client, cn *cutNet, bound *agent, victim *testWorker, connects func(string) float64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cn.cut(victim, "blackhole", cancel)
	before := connects("context")
	giveUp(t, ctx, c, te, bound, "given up")
	waitFor(t, "the connect the given-up request started marking the instance", 10*time.Second, func() bool {
		in, _ := te.e.Fleet().Instance(victim.id, time.Now())
		return in.Unreachable
	})
	if r := bound.send(t, c, te, "after giving up", nil); r.ctxInst == victim.id || connects("context") != before {
		t.Fatalf("the next turn on %s after %v failed connects; want elsewhere, without one", r.ctxInst, connects("context")-before)
	}
	cn.cut(victim, "", nil)
	waitFor(t, "the victim reachable again", 10*time.Second, func() bool {
		in, _ := te.e.Fleet().Instance(victim.id, time.Now())
		return !in.Unreachable && in.Healthy
	})
}

// giveUp sends a's next turn (user) with ctx, whose cancellation is the
// client giving up: it must not be answered.
func giveUp(t *testing.T, ctx context.Context, c *http.Client, te *testEdge, a *agent, user string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, te.url()+"/v1/chat/completions",
		bytes.NewReader(chatBody(t, a.system, append(append([]string(nil), a.turns...), user), nil)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-session-id", a.session)
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the request whose client gave up was answered %d", resp.StatusCode)
	}
}

// stalledKeptAliveMarks: the victim cut as a partition cuts, its
// connections kept alive left open and never answered. The key's turn
// goes out on one, stalls, and its client gives up: the edge probes the
// suspect victim at once on a new connection, whose connect fails and
// marks it; the next turn goes elsewhere without a connect.
func stalledKeptAliveMarks(t *testing.T, te *testEdge, c *http.Client, cn *cutNet, bound *agent, victim *testWorker, connects func(string) float64) {
	t.Helper()
	if r := bound.send(t, c, te, "kept alive", nil); r.ctxInst != victim.id {
		t.Fatalf("the bound key's turn before the cut on %s, want %s", r.ctxInst, victim.id)
	}
	hold := make(chan struct{})
	victim.gate.Store(&hold)
	defer func() {
		victim.gate.Store(nil)
		close(hold)
		cn.cut(victim, "", nil)
	}()
	cn.cutKeepingConns(victim, "blackhole", nil)
	seen := len(victim.requests())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		defer cancel() // the client gives up once the hop waits at the victim
		for len(victim.requests()) <= seen && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
	}()
	before := connects("context")
	giveUp(t, ctx, c, te, bound, "stalled")
	waitFor(t, "the suspect victim's probe marking it", 10*time.Second, func() bool {
		in, _ := te.e.Fleet().Instance(victim.id, time.Now())
		return in.Unreachable
	})
	if r := bound.send(t, c, te, "after the stall", nil); r.ctxInst == victim.id || connects("context") != before {
		t.Fatalf("the next turn on %s after %v failed connects; want elsewhere, without one", r.ctxInst, connects("context")-before)
	}
}
