package fleetview

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/natstest"
)

// The backoff of an instance a connect failed to: the first failure marks
// it for the first backoff; a failure of an attempt begun before the last
// one recorded (in flight when the connection failed) says nothing new;
// each later one doubles the backoff, up to its cap; the mark holds past
// its backoff while a probe is in flight; and only a connection made by
// an attempt begun after the last failure clears it.
func TestReachBackoff(t *testing.T) {
	p := reachPolicy{first: time.Second, max: 4 * time.Second}
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var r reachState
	if r.held(t0, true) {
		t.Fatal("the zero state is marked")
	}
	if rec, marked := r.fail(p, at(-5*time.Second), t0, "refused"); !rec || !marked {
		t.Fatalf("first failure: recorded %v, marked %v", rec, marked)
	}
	if !r.held(at(999*time.Millisecond), false) || r.held(at(time.Second), false) {
		t.Fatalf("first mark: want held for exactly 1s, %+v", r)
	}
	if !r.held(at(time.Second), true) {
		t.Fatal("a mark past its backoff with a probe in flight does not hold")
	}
	// A hop that began before the failure and ends after it.
	if rec, _ := r.fail(p, at(-time.Millisecond), at(100*time.Millisecond), "refused"); rec || r.failures != 1 || r.backoff != time.Second {
		t.Fatalf("an attempt in flight at the failure was recorded: %+v", r)
	}
	if r.reach(at(-time.Millisecond)) {
		t.Fatal("a connection made by an attempt begun before the failure cleared the mark")
	}
	for i, want := range []time.Duration{2 * time.Second, 4 * time.Second, 4 * time.Second} {
		now := at(time.Duration(i+1) * 10 * time.Second)
		if rec, marked := r.fail(p, now.Add(-time.Millisecond), now, "timeout"); !rec || marked {
			t.Fatalf("failure %d: recorded %v, marked %v", i+2, rec, marked)
		}
		if r.backoff != want || !r.until.Equal(now.Add(want)) || r.failures != i+2 || r.lastErr != "timeout" {
			t.Fatalf("failure %d: %+v, want a backoff of %s from %s", i+2, r, want, now)
		}
	}
	if !r.since.Equal(t0) {
		t.Fatalf("since %s, want the first failure's %s", r.since, t0)
	}
	if !r.reach(r.last) || r.held(r.last, true) || r != (reachState{}) {
		t.Fatalf("a connection made after the last failure left %+v", r)
	}
}

// switchNet is a transport whose connects to one address can be refused,
// or black-holed (the connect times out), while everything else goes
// through.
type switchNet struct {
	mode atomic.Value // "", "refuse", "blackhole"
	addr string
	tr   *http.Transport
}

func newSwitchNet(addr string) *switchNet {
	n := &switchNet{addr: addr}
	n.mode.Store("")
	d := &net.Dialer{}
	n.tr = &http.Transport{DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
		switch m := n.mode.Load().(string); {
		case a != n.addr || m == "":
			return d.DialContext(ctx, network, a)
		case m == "refuse":
			return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
		}
		t := time.NewTimer(50 * time.Millisecond) // the connect's timeout
		defer t.Stop()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
			return nil, &net.OpError{Op: "dial", Net: network, Err: os.ErrDeadlineExceeded}
		}
	}}
	return n
}

// set switches the address's connects and drops the kept-alive
// connections (a partition ends them).
func (n *switchNet) set(mode string) {
	n.mode.Store(mode)
	n.tr.CloseIdleConnections()
}

// hop sends one hop to instance id at url as the dispatcher does (BeginHop,
// End) and reports its error.
func hop(t *testing.T, f *View, c *http.Client, id, url string) error {
	t.Helper()
	ctx := context.Background()
	hctx, a := f.BeginHop(ctx, id)
	req, _ := http.NewRequestWithContext(hctx, http.MethodPost, url+"/v1/chat/completions", nil)
	resp, err := c.Do(req)
	a.End(ctx, err)
	if err == nil {
		resp.Body.Close()
	}
	return err
}

// A worker whose telemetry arrives but that this edge cannot connect to:
// a refused connect marks it unreachable (unhealthy, not silent, the
// gauge at 1) and it is probed at once; its reports do not clear the
// mark; the mark lapses after its backoff with no probe in flight, and the
// next failure doubles it; a hop that connects clears it, a failed one
// marks it again, and a probe that connects clears that; a black-holed
// connect marks it as a refused one does; a report naming a new address
// clears it. A 5xx answer is a connection made.
func TestFailedConnectMarksUnreachable(t *testing.T) {
	var status atomic.Int32
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(int(status.Load())) }))
	t.Cleanup(srv.Close)
	sn := newSwitchNet(srv.Listener.Addr().String())
	c := &http.Client{Transport: sn.tr}
	f, reg, nc, clk := clockedFleetWith(t, Config{ProbeClient: c, ProbeInterval: time.Hour, ReachBackoff: time.Second, ReachMaxBackoff: 8 * time.Second})
	r := report("w1", telemetry.FleetContext, 1, 1, 0)
	r.URL = srv.URL
	publishLoad(t, nc, r)
	waitFor(t, "registration", 5*time.Second, func() bool { in, _ := f.Instance("w1", clk.now()); return in.Healthy })

	sn.set("refuse")
	if err := hop(t, f, c, "w1", srv.URL); err == nil {
		t.Fatal("a refused hop succeeded")
	}
	// The probe sent at once fails too: a second failure, 2 s.
	waitFor(t, "the probe of the marked instance", 5*time.Second, func() bool {
		in, _ := f.Instance("w1", clk.now())
		return in.ConnectFailures == 2 && !probing(f, "w1")
	})
	refresh(t, nc, f, clk, &r) // its telemetry goes on
	in, _ := f.Instance("w1", clk.now())
	v := viewOf(t, f, "w1", clk.now())
	if !in.Unreachable || in.Healthy || !in.Telemetry || !in.UnreachableUntil.Equal(clk.now().Add(2*time.Second)) ||
		v.Healthy || !v.Unreachable || v.Silent || in.LastConnectError == "" {
		t.Fatalf("after a refused connect and a failed probe, reports arriving: %+v, view %+v", in, v)
	}
	if g := metric(t, reg, "tether_edge_instance_unreachable", map[string]string{"instance": "w1"}); g != 1 {
		t.Fatalf("tether_edge_instance_unreachable %v", g)
	}

	// The backoff passes, no probe in flight: a request may try it again.
	clk.advance(2 * time.Second)
	refresh(t, nc, f, clk, &r)
	if v := viewOf(t, f, "w1", clk.now()); !v.Healthy || v.Unreachable {
		t.Fatalf("after the backoff: %+v", v)
	}
	_ = hop(t, f, c, "w1", srv.URL)
	if in, _ := f.Instance("w1", clk.now()); !in.Unreachable || in.ConnectFailures != 3 || !in.UnreachableUntil.Equal(clk.now().Add(4*time.Second)) {
		t.Fatalf("a third failure: %+v, want 4 s", in)
	}

	// Healed: a hop answered (a 5xx is an answer) clears the mark.
	sn.set("")
	status.Store(http.StatusServiceUnavailable)
	if err := hop(t, f, c, "w1", srv.URL); err != nil {
		t.Fatal(err)
	}
	if in, _ := f.Instance("w1", clk.now()); in.Unreachable || !in.Healthy || !in.UnreachableSince.IsZero() || in.ConnectFailures != 0 {
		t.Fatalf("after a hop connected: %+v", in)
	}
	if g := metric(t, reg, "tether_edge_instance_unreachable", map[string]string{"instance": "w1"}); g != 0 {
		t.Fatalf("tether_edge_instance_unreachable %v after the heal", g)
	}

	// Black-holed: the connect times out; healed, the probe clears it.
	sn.set("blackhole")
	_ = hop(t, f, c, "w1", srv.URL)
	waitFor(t, "the black-holed instance marked and probed", 5*time.Second, func() bool {
		in, _ := f.Instance("w1", clk.now())
		return in.Unreachable && in.ConnectFailures == 2 && !probing(f, "w1")
	})
	sn.set("")
	f.kickProbes()
	waitFor(t, "a probe connecting clears the mark", 5*time.Second, func() bool {
		in, _ := f.Instance("w1", clk.now())
		return !in.Unreachable && in.ConnectFailures == 0
	})

	// Marked again, then the worker reports a new address.
	sn.set("refuse")
	_ = hop(t, f, c, "w1", srv.URL)
	waitFor(t, "marked again", 5*time.Second, func() bool { in, _ := f.Instance("w1", clk.now()); return in.Unreachable })
	r.Seq++
	r.URL = "http://127.0.0.1:1"
	publishLoad(t, nc, r)
	waitFor(t, "the new address clears the mark", 5*time.Second, func() bool {
		in, _ := f.Instance("w1", clk.now())
		return !in.Unreachable && in.URL == r.URL
	})
}

// A cancelled request, or a hop to an unknown instance, teaches nothing.
func TestCancelledHopTeachesNothing(t *testing.T) {
	sn := newSwitchNet("127.0.0.1:9")
	sn.set("blackhole")
	c := &http.Client{Transport: sn.tr}
	f, _, nc, clk := clockedFleetWith(t, Config{ProbeClient: c, ProbeInterval: time.Hour})
	r := report("w1", telemetry.FleetContext, 1, 1, 0)
	r.URL = "http://127.0.0.1:9"
	publishLoad(t, nc, r)
	waitFor(t, "registration", 5*time.Second, func() bool { in, _ := f.Instance("w1", clk.now()); return in.Healthy })
	ctx, cancel := context.WithCancel(context.Background())
	hctx, a := f.BeginHop(ctx, "w1")
	req, _ := http.NewRequestWithContext(hctx, http.MethodPost, r.URL, nil)
	cancel()
	_, err := c.Do(req)
	a.End(ctx, err)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	if in, _ := f.Instance("w1", clk.now()); in.Unreachable || in.ConnectFailures != 0 {
		t.Fatalf("a cancelled hop marked the instance: %+v", in)
	}
	_, a = f.BeginHop(context.Background(), "nobody")
	a.End(context.Background(), errors.New("refused"))
}

// clockedFleetWith is clockedFleet with more settings.
func clockedFleetWith(t *testing.T, cfg Config) (*View, *prometheus.Registry, *nats.Conn, *clock) {
	t.Helper()
	ns := natstest.Start(t, nil)
	clk := &clock{}
	clk.advance(time.Hour)
	cfg.Conn, cfg.StaleIntervals, cfg.MinStaleAfter, cfg.Now = connect(t, ns.ClientURL()), 3, 200*time.Millisecond, clk.now
	f, reg := newFleet(t, cfg)
	return f, reg, connect(t, ns.ClientURL()), clk
}

// probing reports whether a probe of id is in flight.
func probing(f *View, id string) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.byID[id].probing
}

// refresh publishes r's next report and waits until the view took it at
// the clock's time.
func refresh(t *testing.T, nc *nats.Conn, f *View, clk *clock, r *telemetry.LoadReport) {
	t.Helper()
	r.Seq++
	publishLoad(t, nc, *r)
	waitFor(t, "the report", 5*time.Second, func() bool { in, _ := f.Instance(r.Instance, clk.now()); return in.LastSeen.Equal(clk.now()) })
}
