package fleetview

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/natstest"
)

// addressBook is a VerifyAddress that proves the identities it lists at
// their addresses and records what it was asked.
type addressBook struct {
	mu    sync.Mutex
	at    map[string]string // url → the worker id the server there proves
	asked []string
}

func (b *addressBook) verify(ctx context.Context, worker, url string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if id, ok := ExpectedWorker(ctx); !ok || id != worker {
		return errors.New("the check's context does not carry the expected identity")
	}
	b.asked = append(b.asked, worker+"@"+url)
	if b.at[url] != worker {
		return errors.New("certificate names " + b.at[url])
	}
	return nil
}

func (b *addressBook) set(url, worker string) {
	b.mu.Lock()
	b.at[url] = worker
	b.mu.Unlock()
}

// A discovered worker is usable only at an address where it proved its
// identity; a report moving it elsewhere is refused, counted, and leaves
// its proven address in place; a move it proves is adopted.
func TestReportsMoveAnInstanceOnlyToAnAddressItProves(t *testing.T) {
	srv := natstest.Start(t, nil)
	nc := connect(t, srv.ClientURL())
	book := &addressBook{at: map[string]string{}}
	real, impostor, moved := "https://10.0.0.1:9000", "https://10.0.0.2:9000", "https://10.0.0.3:9000"
	book.set(real, "ctx-1")
	book.set(impostor, "ctx-2")
	f, reg := newFleet(t, Config{Conn: nc, VerifyAddress: book.verify})

	r := report("ctx-1", telemetry.FleetContext, 7, 1, 0)
	r.URL = real
	url := func() string {
		in, ok := f.Instance("ctx-1", time.Now())
		if !ok {
			return ""
		}
		return in.URL
	}
	// The first report waits for the check; the next ones register.
	waitFor(t, "ctx-1 registered at its proven address", 5*time.Second, func() bool {
		r.Seq++
		publishLoad(t, nc, r)
		return url() == real
	})

	forged := r
	forged.URL, forged.BootID = impostor, 99
	waitFor(t, "the forged address refused", 5*time.Second, func() bool {
		forged.Seq++
		publishLoad(t, nc, forged)
		return metric(t, reg, "tether_edge_telemetry_dropped_total", map[string]string{"kind": "load", "reason": "address_refused"}) > 0
	})
	if got := metric(t, reg, "tether_edge_worker_address_refused_total", nil); got < 1 {
		t.Errorf("failed address checks counted %v, want ≥ 1", got)
	}
	r.Seq++
	publishLoad(t, nc, r)
	if in, _ := f.Instance("ctx-1", time.Now()); in.URL != real || in.BootID != 7 || !in.Healthy {
		t.Errorf("after forged reports ctx-1 is %+v, want its proven address %s, boot 7, healthy", in, real)
	}

	// A move the worker proves (a restart on another host) is adopted.
	book.set(moved, "ctx-1")
	r.URL, r.BootID = moved, 8
	waitFor(t, "the proven move adopted", 5*time.Second, func() bool {
		r.Seq++
		publishLoad(t, nc, r)
		return url() == moved
	})

	// Hops to a discovered instance expect its identity; static ones not.
	if id, ok := ExpectedWorker(f.ExpectIdentity(context.Background(), "ctx-1")); !ok || id != "ctx-1" {
		t.Errorf("a hop to ctx-1 expects %q %v, want ctx-1", id, ok)
	}
	if _, ok := ExpectedWorker(f.ExpectIdentity(context.Background(), "unknown")); ok {
		t.Error("a hop to an unknown instance carries an expectation")
	}
}

// Without VerifyAddress (no transport identity to check) reports give the
// address as before.
func TestReportsGiveTheAddressWithoutVerification(t *testing.T) {
	srv := natstest.Start(t, nil)
	nc := connect(t, srv.ClientURL())
	f, _ := newFleet(t, Config{Conn: nc})
	r := report("w1", telemetry.FleetContext, 7, 1, 0)
	publishLoad(t, nc, r)
	waitFor(t, "w1 registered", 5*time.Second, func() bool {
		in, ok := f.Instance("w1", time.Now())
		return ok && in.URL == r.URL
	})
}

// Static instances take their URL from configuration: no check, and hops
// to them carry no worker expectation.
func TestStaticInstancesNeedNoAddressCheck(t *testing.T) {
	srv := natstest.Start(t, nil)
	nc := connect(t, srv.ClientURL())
	book := &addressBook{at: map[string]string{}}
	f, _ := newFleet(t, Config{Conn: nc, VerifyAddress: book.verify,
		Static: []Static{{ID: "s1", URL: "http://w1.test:8000", Fleet: fsm.FleetContext}}})
	r := report("w1", telemetry.FleetContext, 7, 1, 0)
	publishLoad(t, nc, r)
	waitFor(t, "the static instance's telemetry applied", 5*time.Second, func() bool {
		in, ok := f.Instance("s1", time.Now())
		return ok && in.Telemetry
	})
	book.mu.Lock()
	asked := len(book.asked)
	book.mu.Unlock()
	if asked != 0 {
		t.Errorf("a static instance's address was checked %d times", asked)
	}
	if _, ok := ExpectedWorker(f.ExpectIdentity(context.Background(), "s1")); ok {
		t.Error("a hop to a static instance carries a worker expectation")
	}
}
