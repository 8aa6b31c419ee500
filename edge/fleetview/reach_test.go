package fleetview

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
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
	healed := r.after.Add(time.Millisecond)
	if !r.reach(healed) || r.held(healed, true) || r != (reachState{after: healed}) {
		t.Fatalf("a connection made after the last failure left %+v", r)
	}
	// A dial into the partition that fails after the heal was seen.
	if rec, _ := r.fail(p, healed.Add(-time.Millisecond), healed.Add(time.Second), "timeout"); rec || !r.since.IsZero() {
		t.Fatalf("an attempt begun before the connection that cleared the mark marked it again: %+v", r)
	}
}

// switchNet is a transport whose connects to one address can be refused,
// or black-holed (the connect times out), while everything else goes
// through. Each connect takes a millisecond of the test's clock (tick).
// watched: the dial is WatchDials's, as the edge's is.
type switchNet struct {
	mode   atomic.Value // "", "refuse", "blackhole"
	addr   string
	tr     *http.Transport
	onDial atomic.Pointer[func()] // called as a connect to addr begins
	// bounded, unbounded: connects to addr with a deadline of at most
	// MarkedConnectTimeout, and the others.
	bounded, unbounded atomic.Int32
}

func newSwitchNet(addr string, tick func(), watched bool) *switchNet {
	n := &switchNet{addr: addr}
	n.mode.Store("")
	d := &net.Dialer{}
	dial := func(ctx context.Context, network, a string) (net.Conn, error) {
		tick()
		if a == n.addr {
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= MarkedConnectTimeout {
				n.bounded.Add(1)
			} else {
				n.unbounded.Add(1)
			}
		}
		switch m := n.mode.Load().(string); {
		case a != n.addr || m == "":
			return d.DialContext(ctx, network, a)
		case m == "refuse":
			return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
		}
		if f := n.onDial.Load(); f != nil {
			(*f)()
		}
		t := time.NewTimer(50 * time.Millisecond) // the connect's timeout
		defer t.Stop()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
			return nil, &net.OpError{Op: "dial", Net: network, Err: os.ErrDeadlineExceeded}
		}
	}
	if watched {
		dial = WatchDials(dial)
	}
	n.tr = &http.Transport{DialContext: dial}
	return n
}

// set switches the address's connects and drops the kept-alive
// connections (a closed port ends them).
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

// unreachableFleet is a view on a fake clock that hears w1 at url and
// sends hops and probes through a switchNet to url's address (probes only
// when kicked).
func unreachableFleet(t *testing.T, url string, watched bool) (*View, *prometheus.Registry, *nats.Conn, *clock, *switchNet, telemetry.LoadReport) {
	t.Helper()
	clk := &clock{}
	clk.advance(time.Hour)
	sn := newSwitchNet(strings.TrimPrefix(url, "http://"), func() { clk.advance(time.Millisecond) }, watched)
	fresh := sn.tr.Clone()
	fresh.DisableKeepAlives = true
	f, reg, nc := clockedFleetWith(t, clk, Config{ProbeClient: &http.Client{Transport: sn.tr}, ReachClient: &http.Client{Transport: fresh},
		ProbeInterval: time.Hour, ReachBackoff: time.Second, ReachMaxBackoff: 8 * time.Second})
	r := report("w1", telemetry.FleetContext, 1, 1, 0)
	r.URL = url
	publishLoad(t, nc, r)
	waitFor(t, "registration", 5*time.Second, func() bool { in, _ := f.Instance("w1", clk.now()); return in.Healthy })
	return f, reg, nc, clk, sn, r
}

// A worker whose telemetry arrives but that this edge cannot connect to:
// a refused connect marks it unreachable (unhealthy, not silent, the
// gauge at 1), counted once though both its dial and its hop's end see
// it, and it is probed at once; its reports do not clear the mark; the
// mark lapses after its backoff with no probe in flight, and the next
// failure doubles it; a hop that connects clears it (a 5xx is an answer),
// a failed one marks it again, and a probe that connects clears that; a
// black-holed connect marks it as a refused one does; a report naming a
// new address clears it.
func TestFailedConnectMarksUnreachable(t *testing.T) {
	var status atomic.Int32
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(int(status.Load())) }))
	t.Cleanup(srv.Close)
	f, reg, nc, clk, sn, r := unreachableFleet(t, srv.URL, true)
	c := &http.Client{Transport: sn.tr}

	sn.set("refuse")
	if err := hop(t, f, c, "w1", srv.URL); err == nil || sn.unbounded.Load() != 1 {
		t.Fatalf("a refused hop: err %v, %d connects with the transport's own timeout, want 1 (not marked yet)", err, sn.unbounded.Load())
	}
	// The probe sent at once fails too: a second failure, 2 s.
	waitFor(t, "the probe of the marked instance", 5*time.Second, func() bool {
		in, _ := f.Instance("w1", clk.now())
		return in.ConnectFailures == 2 && !probing(f, "w1")
	})
	until := clk.now().Add(2 * time.Second)
	refresh(t, nc, f, clk, &r) // its telemetry goes on
	in, _ := f.Instance("w1", clk.now())
	v := viewOf(t, f, "w1", clk.now())
	if !in.Unreachable || in.Healthy || !in.Telemetry || !in.UnreachableUntil.Equal(until) ||
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
	bounded := sn.bounded.Load()
	_ = hop(t, f, c, "w1", srv.URL)
	if in, _ := f.Instance("w1", clk.now()); !in.Unreachable || in.ConnectFailures != 3 || !in.UnreachableUntil.Equal(clk.now().Add(4*time.Second)) {
		t.Fatalf("a third failure: %+v, want 4 s", in)
	}
	if n := sn.bounded.Load() - bounded; n != 1 {
		t.Fatalf("%d connects bounded by MarkedConnectTimeout for the hop to the marked instance, want 1", n)
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
	reachAgainByProbeAndMove(t, f, nc, clk, sn, c, r)
}

// reachAgainByProbeAndMove: black-holed, the instance is marked; healed,
// a probe clears the mark; marked again, a report naming a new address
// clears it.
func reachAgainByProbeAndMove(t *testing.T, f *View, nc *nats.Conn, clk *clock, sn *switchNet, c *http.Client, r telemetry.LoadReport) {
	t.Helper()
	sn.set("blackhole")
	_ = hop(t, f, c, "w1", r.URL)
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
	sn.set("refuse")
	_ = hop(t, f, c, "w1", r.URL)
	waitFor(t, "marked again", 5*time.Second, func() bool { in, _ := f.Instance("w1", clk.now()); return in.Unreachable })
	moved := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(moved.Close)
	r.Seq++
	r.URL = moved.URL
	publishLoad(t, nc, r)
	waitFor(t, "the new address clears the mark", 5*time.Second, func() bool {
		in, _ := f.Instance("w1", clk.now())
		return !in.Unreachable && in.URL == r.URL
	})
}

// A hop whose client went away teaches nothing by its end; the connect it
// started, which net/http finishes for the next request, does: when that
// fails the instance is marked, through the transport's watched dial.
// Without the watch (a transport that is not the edge's), nothing is
// learnt.
func TestFailedConnectAfterTheClientGaveUp(t *testing.T) {
	for _, watched := range []bool{false, true} {
		t.Run(map[bool]string{false: "unwatched", true: "watched"}[watched], func(t *testing.T) {
			f, _, _, clk, sn, r := unreachableFleet(t, "http://127.0.0.1:9", watched)
			sn.set("blackhole")
			ctx, cancel := context.WithCancel(context.Background())
			hctx, a := f.BeginHop(ctx, "w1")
			req, _ := http.NewRequestWithContext(hctx, http.MethodPost, r.URL, nil)
			giveUp := func() { cancel() } // the client gives up during the connect
			sn.onDial.Store(&giveUp)
			_, err := (&http.Client{Transport: sn.tr}).Do(req)
			a.End(ctx, err)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err %v", err)
			}
			if !watched {
				if in, _ := f.Instance("w1", clk.now()); in.Unreachable || in.ConnectFailures != 0 {
					t.Fatalf("a cancelled hop marked the instance: %+v", in)
				}
				return
			}
			waitFor(t, "the connect's failure marking the instance", 5*time.Second, func() bool {
				in, _ := f.Instance("w1", clk.now())
				return in.Unreachable
			})
		})
	}
}

// clockedFleetWith is clockedFleet on clk with more settings.
func clockedFleetWith(t *testing.T, clk *clock, cfg Config) (*View, *prometheus.Registry, *nats.Conn) {
	t.Helper()
	ns := natstest.Start(t, nil)
	cfg.Conn, cfg.StaleIntervals, cfg.MinStaleAfter, cfg.Now = connect(t, ns.ClientURL()), 3, 200*time.Millisecond, clk.now
	f, reg := newFleet(t, cfg)
	return f, reg, connect(t, ns.ClientURL())
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

// A hop on a connection kept alive from before the partition stalls, and
// its client gives up: no evidence by itself, but the instance is suspect
// and probed at once on a new connection, whose failed connect marks it.
// A suspect instance that answers its probe stays reachable.
func TestStalledHopMakesTheInstanceSuspect(t *testing.T) {
	stalled := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/stall" {
			stalled <- struct{}{}
			<-r.Context().Done()
			return
		}
	}))
	t.Cleanup(srv.Close)
	f, reg, _, clk, sn, _ := unreachableFleet(t, srv.URL, true)
	c := &http.Client{Transport: sn.tr}
	stall := func() {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		hctx, a := f.BeginHop(ctx, "w1")
		req, _ := http.NewRequestWithContext(hctx, http.MethodPost, srv.URL+"/v1/stall", nil)
		go func() {
			<-stalled
			cancel() // the client gives up
		}()
		_, err := c.Do(req)
		a.End(ctx, err)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the stalled hop: %v", err)
		}
	}
	for _, cut := range []bool{false, true} {
		if err := hop(t, f, c, "w1", srv.URL); err != nil { // a connection kept alive
			t.Fatal(err)
		}
		probes := metric(t, reg, "tether_edge_probes_total", nil)
		if cut {
			sn.mode.Store("refuse") // new connects fail; the kept-alive one stays open
		}
		stall()
		waitFor(t, "the suspect instance probed", 5*time.Second, func() bool {
			return metric(t, reg, "tether_edge_probes_total", nil) > probes && !probing(f, "w1")
		})
		if in, _ := f.Instance("w1", clk.now()); in.Unreachable != cut || !cut && !in.Healthy {
			t.Fatalf("cut %v: after the stalled hop's probe %+v", cut, in)
		}
	}
}

// Marks set and cleared while the instance's reports arrive: the view's
// records of it are read under its lock (run with -race).
func TestReachWhileReportsArrive(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	f, _, nc, clk, sn, r := unreachableFleet(t, srv.URL, true)
	c := &http.Client{Transport: sn.tr}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 200; i++ {
			r.Seq++
			publishLoad(t, nc, r)
		}
	}()
	for i := 0; i < 40; i++ {
		sn.set(map[bool]string{true: "refuse", false: ""}[i%2 == 0])
		clk.advance(time.Minute) // past any backoff
		_ = hop(t, f, c, "w1", srv.URL)
	}
	<-done
}
