package fleetview

import (
	"context"
	"sync"
	"time"

	"github.com/tether-project/tether/internal/telemetry"
)

// Address trust. A worker that registers through telemetry says where it
// listens (its load report's url), and the edge sends that instance's
// prompts there. NATS permissions decide who may publish on an instance's
// subjects; where several workers share one NATS identity, any of them
// can publish a report naming another instance. So an address is trusted
// only from the instance itself:
//
//   - every hop and probe to a discovered instance carries the identity the
//     server must prove (ExpectWorker): with mutual TLS the edge's transport
//     refuses a server whose certificate does not name
//     spiffe://tether/worker/<instance>, before anything is sent;
//   - with Config.VerifyAddress set, a report naming an address the
//     instance has not proven is not applied: the edge dials the new address
//     expecting the instance's identity, and only once that succeeds do the
//     instance's reports from there count (registration, heartbeat, load).
//     A report whose address failed the check is refused and counted
//     (tether_edge_telemetry_dropped_total{kind="load",reason="address_refused"});
//     the instance keeps its proven address meanwhile, so a forged report
//     neither diverts its traffic nor takes it out of service.
//
// Static instances are exempt: their URL is configuration, not telemetry.

// expectedWorkerKey is the context key of ExpectWorker.
type expectedWorkerKey struct{}

// ExpectWorker returns ctx carrying the worker identity (its instance id)
// that the server dialed for a request made with ctx must prove.
func ExpectWorker(ctx context.Context, workerID string) context.Context {
	return context.WithValue(ctx, expectedWorkerKey{}, workerID)
}

// ExpectedWorker is the identity ExpectWorker put in ctx.
func ExpectedWorker(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(expectedWorkerKey{}).(string)
	return id, ok && id != ""
}

// ExpectIdentity returns ctx carrying the identity a hop to instance id
// must reach: the worker's own id for an instance that registered through
// telemetry. A static instance's ctx is returned unchanged (its server is
// verified as configured: the URL's host or tls.worker_server_name).
func (f *View) ExpectIdentity(ctx context.Context, id string) context.Context {
	f.mu.RLock()
	in, ok := f.byID[id]
	var worker string
	if ok && !in.static {
		worker = in.workerID
	}
	f.mu.RUnlock()
	if worker == "" {
		return ctx
	}
	return ExpectWorker(ctx, worker)
}

const (
	// addressRetry: an address that failed verification is not dialed
	// again for this long (its reports are refused meanwhile).
	addressRetry = 5 * time.Second
	// maxAddressChecks bounds verifications in flight: a flood of forged
	// reports must not become a flood of dials.
	maxAddressChecks = 4
	// maxAddressStates bounds the instances whose addresses are tracked
	// (reports for new instances beyond it wait for housekeeping).
	maxAddressStates = 1 << 14
	// addressCheckTimeout bounds one verification.
	addressCheckTimeout = 5 * time.Second
)

// addressState is what the edge knows of one worker id's addresses.
type addressState struct {
	proven   string    // the address the instance proved last ("" none)
	checking string    // the address being verified ("" none)
	failed   string    // the last address that failed verification
	failedAt time.Time // when
	touched  time.Time // last report naming this worker id
}

// addresses tracks address verification (under its own lock: a
// verification finishes on its own goroutine).
type addresses struct {
	mu     sync.Mutex
	byID   map[string]*addressState
	checks int // in flight
}

// admitAddress reports whether r's address is proven for its instance, so
// that r may be applied; otherwise it starts (or waits for) a verification
// and counts the report dropped.
func (f *View) admitAddress(r telemetry.LoadReport) bool {
	if f.cfg.VerifyAddress == nil || f.staticReport(r) {
		return true
	}
	now := f.cfg.Now()
	a := &f.addrs
	a.mu.Lock()
	st := a.byID[r.Instance]
	if st == nil {
		if len(a.byID) >= maxAddressStates {
			a.mu.Unlock()
			f.metrics.dropped.WithLabelValues("load", "address_unverified").Inc()
			return false
		}
		st = &addressState{}
		a.byID[r.Instance] = st
	}
	st.touched = now
	switch {
	case st.proven != "" && sameURL(st.proven, r.URL):
		a.mu.Unlock()
		return true
	case st.checking != "":
		a.mu.Unlock()
		f.metrics.dropped.WithLabelValues("load", "address_unverified").Inc()
		return false
	case st.failed != "" && sameURL(st.failed, r.URL) && now.Sub(st.failedAt) < addressRetry:
		a.mu.Unlock()
		f.metrics.dropped.WithLabelValues("load", "address_refused").Inc()
		return false
	case a.checks >= maxAddressChecks:
		a.mu.Unlock()
		f.metrics.dropped.WithLabelValues("load", "address_unverified").Inc()
		return false
	}
	st.checking = r.URL
	a.checks++
	a.mu.Unlock()
	f.metrics.dropped.WithLabelValues("load", "address_unverified").Inc()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.verifyAddress(r.Instance, r.URL)
	}()
	return false
}

// staticReport: r speaks for a static instance (whose URL is configured,
// never taken from telemetry), as resolveLocked would find it.
func (f *View) staticReport(r telemetry.LoadReport) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if id, ok := f.alias[r.Instance]; ok {
		if in, ok := f.byID[id]; ok && in.static {
			return true
		}
	}
	if in, ok := f.byID[r.Instance]; ok {
		return in.static
	}
	for _, in := range f.byID {
		if in.static && in.workerID == "" && sameURL(in.url, r.URL) {
			return true
		}
	}
	return false
}

// verifyAddress dials url expecting worker's identity and records the
// outcome.
func (f *View) verifyAddress(worker, url string) {
	ctx, cancel := context.WithTimeout(f.ctx, addressCheckTimeout)
	err := f.cfg.VerifyAddress(ExpectWorker(ctx, worker), worker, url)
	cancel()
	a := &f.addrs
	a.mu.Lock()
	st := a.byID[worker]
	a.checks--
	var from string
	if st != nil {
		from = st.proven
		st.checking = ""
		if err == nil {
			st.proven, st.failed, st.failedAt = url, "", time.Time{}
		} else {
			st.failed, st.failedAt = url, f.cfg.Now()
		}
	}
	a.mu.Unlock()
	switch {
	case err == nil && from != "" && !sameURL(from, url):
		f.log.Info("worker address moved: the instance proved its identity at the new address", "instance", worker, "from", from, "to", url)
	case err != nil && f.ctx.Err() == nil:
		f.metrics.addressRefused.Inc()
		f.log.Warn("refusing load reports that give a worker an address where it did not prove its identity",
			"instance", worker, "address", url, "proven_address", from, "err", err)
	}
}

// expireAddresses drops the address states of worker ids neither known
// as an instance nor reported for ForgetAfter (housekeeping).
func (f *View) expireAddresses(now time.Time) {
	if f.cfg.VerifyAddress == nil {
		return
	}
	f.mu.RLock()
	known := make(map[string]bool, len(f.byID))
	for _, in := range f.byID {
		if in.workerID != "" {
			known[in.workerID] = true
		}
	}
	f.mu.RUnlock()
	a := &f.addrs
	a.mu.Lock()
	for id, st := range a.byID {
		if !known[id] && st.checking == "" && now.Sub(st.touched) > f.cfg.ForgetAfter {
			delete(a.byID, id)
		}
	}
	a.mu.Unlock()
}
