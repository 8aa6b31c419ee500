package fleetview

import (
	"context"
	"errors"
	"net"
	"net/http/httptrace"
	"sync/atomic"
	"time"
)

// Reachability from this edge. A worker the edge cannot open a connection
// to (a network partition between them) while its telemetry still arrives
// over NATS reports itself healthy, and each hop placed there waits out a
// connect before it is retried elsewhere. A failed connect is the evidence:
// a hop or probe that sought a connection to the instance, made none and
// failed (refused, no route, the connect timed out; not a 5xx, not a TLS
// handshake with the wrong server, not a client that went away) marks the
// instance unreachable from this edge. Marked, it is unhealthy in the
// routing views (never Silent, so never woken) and probed in the
// background; a connection made to it, by a probe or a hop, clears the
// mark. The mark holds for a backoff, ReachBackoff after the first
// failure, doubled by each further one up to ReachMaxBackoff, and for as
// long as a probe of it is in flight: while the probes go on failing it
// never lapses, and when no probe can tell (none could be started), a
// request tries the instance again once the backoff has passed.
//
// Two places see a failed connect. The hop's (or probe's) own end
// (Attempt.End), when it sought a connection, made none and failed while
// its client still waited; and the dial itself (WatchDials on the
// transport), which net/http goes on with after the request that started
// it gave up: across a partition the connect can take longer than the
// clients wait (a 2 s client timeout against a 3 s failed ARP or a 5 s
// connect timeout), and a client that gives up first must not hide the
// failure, or every request pays the connect until its client gives up.
//
// A hop on a connection kept alive from before a partition sees no
// failure at all: what it sends is never answered, and its client gives
// up. That is no evidence (a long generation answers late too), but it
// makes the instance suspect: it is probed at once, on a new connection
// (Config.ReachClient; so are the probes of a marked instance), and a
// failed connect there marks it.
//
// Only an attempt begun after the last failure recorded says something
// new: the hops that were in flight when the connection failed end with
// the same failure (each seen twice, by its end and by its dial), or, on
// a connection kept alive from before, with an answer that says nothing
// of new connections.

// Reachability's defaults (Config.ReachBackoff, Config.ReachMaxBackoff).
const (
	DefaultReachBackoff    = time.Second
	DefaultReachMaxBackoff = 30 * time.Second
)

// MarkedConnectTimeout bounds a connect to an instance marked unreachable
// (WatchDials), the transport's own timeout still bounding the others. No
// soft-affinity request is sent to a marked instance while its mark
// holds; what still connects there is its probes, requests pinned to it
// (a stored response or conversation it holds: nowhere else to go) and,
// once the backoff lapsed with no probe to tell, the request that tries
// it again. For those a connect that has not completed in a second
// (Linux's first SYN retransmission) is not waited for: a pinned request
// is answered 503 with Retry-After within a client's usual timeout rather
// than after the full connect timeout, when its client may be gone.
const MarkedConnectTimeout = time.Second

// reachState is what this edge's connections taught it about one
// instance (under View.mu). The zero value is reachable.
type reachState struct {
	since    time.Time     // the first failure of this run; zero: reachable
	until    time.Time     // the mark holds until then (and while probed)
	backoff  time.Duration // the current backoff
	failures int           // failed connects recorded in this run
	lastErr  string
	// after: attempts begun before it say nothing new (the last failure
	// recorded, or the start of the attempt whose connection cleared the
	// last mark: a dial into the partition that fails after the heal).
	after time.Time
}

// reachPolicy is the backoff: its first length and its cap.
type reachPolicy struct{ first, max time.Duration }

// fail records a failed connect by an attempt begun at began and ended at
// now. It reports whether the failure was recorded, and whether it marked
// a reachable instance.
func (r *reachState) fail(p reachPolicy, began, now time.Time, err string) (recorded, marked bool) {
	switch {
	case began.Before(r.after):
		return false, false // in flight at the last failure or heal: nothing new
	case r.since.IsZero():
		*r = reachState{since: now, until: now.Add(p.first), after: now, backoff: p.first, failures: 1, lastErr: err}
		return true, true
	}
	r.backoff = min(2*r.backoff, p.max)
	r.until, r.after, r.lastErr = now.Add(r.backoff), now, err
	r.failures++
	return true, false
}

// reach records a connection made by an attempt begun at began. It
// reports whether that cleared a mark.
func (r *reachState) reach(began time.Time) bool {
	if r.since.IsZero() || began.Before(r.after) {
		return false
	}
	*r = reachState{after: began}
	return true
}

// held reports whether the mark holds at now; probing: a probe of the
// instance is in flight (its answer decides).
func (r *reachState) held(now time.Time, probing bool) bool {
	return !r.since.IsZero() && (now.Before(r.until) || probing)
}

// reachOutcome is what one attempt says of the instance's reachability.
type reachOutcome int

const (
	reachUnknown reachOutcome = iota // nothing (cancelled, no connection sought)
	reachMade                        // a connection was made (or an answer came)
	reachFailed                      // a connection was sought and none made
)

// connTrace follows whether a request sought a connection and made one
// (net/http's client trace: the transport asks for a connection, the
// dialer's connect succeeds, a connection is handed to the request).
type connTrace struct {
	sought    atomic.Bool
	connected atomic.Bool
}

func withConnTrace(ctx context.Context) (context.Context, *connTrace) {
	ct := &connTrace{}
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GetConn: func(string) {
			// A new connection is sought (again, on the transport's retry).
			ct.sought.Store(true)
			ct.connected.Store(false)
		},
		ConnectDone: func(_, _ string, err error) {
			if err == nil {
				ct.connected.Store(true)
			}
		},
		GotConn: func(httptrace.GotConnInfo) { ct.connected.Store(true) },
	}), ct
}

// outcome classifies the request's end: err nil (an answer came) or a
// connection made is reachMade; an error after a connection was sought
// and none made is reachFailed.
func (ct *connTrace) outcome(err error) reachOutcome {
	switch {
	case err == nil || ct.connected.Load():
		return reachMade
	case ct.sought.Load():
		return reachFailed
	}
	return reachUnknown
}

// target is what an attempt (a hop or a probe) is made to: the instance,
// the URL it had when the attempt began (a result for an address the
// instance has since left says nothing of it), and when it began.
type target struct {
	f     *View
	in    *instance
	url   string
	began time.Time
}

// Attempt is one hop's attempt to reach an instance, begun with
// View.BeginHop and ended with End.
type Attempt struct {
	at    *target // nil: an instance the view does not know
	trace *connTrace
}

// BeginHop starts a hop's attempt on instance id: the returned context
// (send the hop with it) tells End whether a connection was made, and the
// transport's dial (WatchDials) whom a failed connect concerns.
func (f *View) BeginHop(ctx context.Context, id string) (context.Context, *Attempt) {
	f.mu.RLock()
	in := f.byID[id]
	var url string
	if in != nil {
		url = in.url
	}
	f.mu.RUnlock()
	a := &Attempt{}
	if in == nil {
		return ctx, a
	}
	a.at = &target{f: f, in: in, url: url, began: f.cfg.Now()}
	ctx, a.trace = a.at.watch(ctx)
	return ctx, a
}

// watch is ctx carrying the connection trace of an attempt on at, and at
// for the transport's dial.
func (at *target) watch(ctx context.Context) (context.Context, *connTrace) {
	return withConnTrace(context.WithValue(ctx, dialKey{}, at))
}

// dialKey is the context key of the target a dial is made for (its
// request's context values outlive the request: net/http dials on after
// it gave up).
type dialKey struct{}

// Dialer is a transport's dial function (net/http.Transport.DialContext).
type Dialer = func(ctx context.Context, network, addr string) (net.Conn, error)

// WatchDials wraps the dial of the transport hops and probes go through:
// a connect made for an attempt (BeginHop, a probe) that fails marks its
// instance unreachable from this edge, whether or not the request that
// started it still waits (net/http finishes a dial after its request
// gave up, for the next request); one that succeeds is a connection made.
// A dial cancelled by the transport (no request wants it any more) says
// nothing. A connect to a marked instance is bounded by
// MarkedConnectTimeout.
func WatchDials(dial Dialer) Dialer {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		at, ok := ctx.Value(dialKey{}).(*target)
		if ok && at.in.marked.Load() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, MarkedConnectTimeout)
			defer cancel()
		}
		c, err := dial(ctx, network, addr)
		switch {
		case !ok:
		case err == nil:
			if at.in.marked.Load() {
				at.reached("connect")
			}
		case !errors.Is(err, context.Canceled):
			at.failed(err)
		}
		return c, err
	}
}

// End records what the hop taught: err is the hop's error (nil: an answer
// came, whatever its status); reqCtx is the request's own context. When
// it is done (the client went away) the hop is no evidence; but one that
// waited on a connection and got no answer makes the instance suspect: it
// is probed at once, on a new connection (a connection kept alive across
// a partition stalls, and the clients give up first, each time).
func (a *Attempt) End(reqCtx context.Context, err error) {
	if a == nil || a.at == nil {
		return
	}
	if reqCtx.Err() != nil {
		if err != nil && a.trace.connected.Load() {
			a.at.f.suspect(a.at.in)
		}
		return
	}
	switch a.trace.outcome(err) {
	case reachMade:
		if a.at.in.marked.Load() {
			a.at.reached("hop")
		}
	case reachFailed:
		a.at.failed(err)
	}
}

// failed records a failed connect of the attempt: the mark, its log line
// and a probe of the instance.
func (at *target) failed(err error) {
	f, in := at.f, at.in
	now := f.cfg.Now()
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	f.mu.Lock()
	if f.byID[in.id] != in || in.url != at.url {
		f.mu.Unlock()
		return // forgotten or moved meanwhile
	}
	recorded, marked := in.reach.fail(f.reachPolicy(), at.began, now, msg)
	in.marked.Store(!in.reach.since.IsZero())
	backoff, failures, fleet := in.reach.backoff, in.reach.failures, in.fleet
	f.mu.Unlock()
	if !recorded {
		return
	}
	f.bump()
	if marked {
		f.log.Warn("instance unreachable from this edge: a connect to it failed; no new requests go there until a probe or hop connects",
			"instance", in.id, "fleet", fleet, "url", at.url, "err", msg, "backoff", backoff)
		f.kickProbes()
		return
	}
	f.log.Debug("instance still unreachable from this edge", "instance", in.id, "failures", failures, "backoff", backoff, "err", msg)
}

// reached records a connection made by the attempt (by: "hop", "probe"
// or "connect", the dial of either).
func (at *target) reached(by string) {
	f, in := at.f, at.in
	now := f.cfg.Now()
	f.mu.Lock()
	since, failures, fleet := in.reach.since, in.reach.failures, in.fleet
	cleared := in.url == at.url && in.reach.reach(at.began)
	if cleared {
		in.marked.Store(false)
	}
	f.mu.Unlock()
	if cleared {
		f.bump()
		f.log.Info("instance reachable again from this edge", "instance", in.id, "fleet", fleet, "by", by,
			"unreachable_for", now.Sub(since), "failed_connects", failures)
	}
}

// moveLocked gives a discovered instance the URL its report names (under
// f.mu): a new address clears a mark, which was the old address's.
func (f *View) moveLocked(in *instance, url string) {
	if in.url != url && in.marked.Load() {
		f.log.Info("instance moved to a new address: its failed connects were the old one's", "instance", in.id, "from", in.url, "to", url)
		in.reach = reachState{}
		in.marked.Store(false)
	}
	in.url = url
}

// reachPolicy is the configured backoff.
func (f *View) reachPolicy() reachPolicy {
	return reachPolicy{first: f.cfg.ReachBackoff, max: f.cfg.ReachMaxBackoff}
}

// unreachableLocked reports whether in is marked unreachable at now (under
// f.mu).
func (f *View) unreachableLocked(in *instance, now time.Time) bool {
	return in.reach.held(now, in.probing)
}

// suspect has in probed for its reachability at once (one probe in flight
// at a time).
func (f *View) suspect(in *instance) {
	f.mu.Lock()
	in.suspect = true
	f.mu.Unlock()
	f.kickProbes()
}

// kickProbes asks the probe loop for a round now (a newly marked instance
// is probed at once, not at the next tick).
func (f *View) kickProbes() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}
