package cluster

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tether-project/tether/cluster/transport"
	"github.com/tether-project/tether/fsm"
)

// maxInflightEntries bounds the log entries the leader's batcher has in
// Raft at once, and maxInflightFrames the forwarding frames a follower has
// outstanding. While the slots are taken, new proposals queue and go out
// together in the next entry/frame: batching without an added delay.
//
// One entry at a time measured best (BenchmarkBindCommit): hashicorp/raft
// writes each dispatched entry to the leader's disk in its single leader
// loop before replicating it, so a second entry in flight mostly halves the
// batches without overlapping any work.
const (
	maxInflightEntries = 1
	maxInflightFrames  = 4
	queueDepth         = 8192
)

// pending is one caller's chunk of proposals travelling through the batcher
// (leader) or the forwarder (follower).
type pending struct {
	props    []fsm.Proposal
	deadline time.Time
	done     chan outcome // buffered 1: the sender never blocks
	queued   time.Time    // when it was queued (stage metrics)
	// forwarded: a follower's proposals (handlePropose); their follower
	// waits to apply the entry, which it can only do once it learns the
	// commit index (see batcher.nudge).
	forwarded bool
}

type outcome struct {
	results []fsm.Result
	index   uint64 // log index of the (last) entry that carried the chunk
	err     error
}

func (p *pending) reply(o outcome) { p.done <- o }

// retryableError marks failures a proposal survives by trying again with the same
// proposal ids (leadership moved, connection failed, no leader yet).
type retryableError struct{ err error }

func (e *retryableError) Error() string { return e.err.Error() }
func (e *retryableError) Unwrap() error { return e.err }

func retryable(err error) error { return &retryableError{err: err} }

func isRetryable(err error) bool {
	var r *retryableError
	if errors.As(err, &r) {
		return true
	}
	// The leader we forwarded to halted or is closing: another will lead.
	var remote *RemoteError
	if errors.As(err, &remote) && (errors.Is(remote.Cause, ErrHalted) || errors.Is(remote.Cause, ErrClosed)) {
		return true
	}
	return errors.Is(err, ErrNotLeader) || errors.Is(err, transport.ErrConnBroken) || errors.Is(err, ErrUnavailable)
}

// NewProposalID draws one random proposal id. A caller that retries a
// proposal itself (after ProposeBatch failed: a timed-out entry may still
// commit) proposes it again with the same id through ProposeIdempotent, so
// the fsm's dedup window applies it at most once.
func NewProposalID() fsm.ProposalID { return newProposalIDs(1)[0] }

// newProposalIDs draws random proposal ids: each proposal keeps its id for
// every internal retry, so the fsm's dedup window makes retries safe.
func newProposalIDs(n int) []fsm.ProposalID {
	ids := make([]fsm.ProposalID, n)
	buf := make([]byte, 16*n)
	_, _ = rand.Read(buf) // crypto/rand.Read never fails on supported platforms
	for i := range ids {
		copy(ids[i][:], buf[16*i:])
	}
	return ids
}

// Propose proposes one event and returns its committed result. It works on
// any node (a follower forwards to the leader) and returns after this node
// applied the entry, so State() shows the effect (read-your-writes). Without
// a leader or quorum it fails with an error wrapping ErrUnavailable within
// min(ctx deadline, ProposeTimeout). An internal retry after a commit that
// was not acknowledged reports fsm.StatusDuplicate (for a Bind, with the
// binding in force).
func (n *Node) Propose(ctx context.Context, ev fsm.Event) (fsm.Result, error) {
	rs, err := n.ProposeBatch(ctx, []fsm.Event{ev})
	if len(rs) == 1 {
		return rs[0], err // valid beside ErrNotApplied
	}
	if err == nil {
		err = fmt.Errorf("cluster: propose: %d results for one event", len(rs))
	}
	return fsm.Result{}, err
}

// ProposeBatch proposes events in order and returns one result per event.
// Up to MaxBatch events travel in one log entry; larger batches are split.
// If the error is ErrNotApplied (the entries committed but this node had
// not applied them in time), the results are still valid.
func (n *Node) ProposeBatch(ctx context.Context, evs []fsm.Event) ([]fsm.Result, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	for i, ev := range evs {
		if ev == nil {
			return nil, fmt.Errorf("cluster: propose: event %d is nil", i)
		}
	}
	ids := newProposalIDs(len(evs))
	props := make([]fsm.Proposal, len(evs))
	for i, ev := range evs {
		props[i] = fsm.Proposal{ID: ids[i], Event: ev}
	}
	return n.proposeAll(ctx, props)
}

// ProposeIdempotent is ProposeBatch with the caller's proposal ids. A
// caller that proposes again after an error (the entry may still commit)
// must reuse the ids: the fsm then applies each proposal once and answers
// the repeat with fsm.StatusDuplicate, as long as the repeat comes within
// the dedup window (the last 65,536 proposals at least, fsm/dedup.go).
// Every id must be non-zero.
func (n *Node) ProposeIdempotent(ctx context.Context, props []fsm.Proposal) ([]fsm.Result, error) {
	if len(props) == 0 {
		return nil, nil
	}
	for i, p := range props {
		if p.Event == nil {
			return nil, fmt.Errorf("cluster: propose: event %d is nil", i)
		}
		if p.ID == (fsm.ProposalID{}) {
			return nil, fmt.Errorf("cluster: propose: proposal %d has no id", i)
		}
	}
	return n.proposeAll(ctx, slices.Clone(props))
}

// proposeAll gets props committed (split into chunks of MaxBatch) and waits
// until this node applied them.
func (n *Node) proposeAll(ctx context.Context, props []fsm.Proposal) ([]fsm.Result, error) {
	evCount := len(props)
	start := time.Now()
	deadline := start.Add(n.cfg.ProposeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()

	results := make([]fsm.Result, 0, evCount)
	var lastIndex uint64
	for len(props) > 0 {
		chunk := props[:min(len(props), n.cfg.MaxBatch)]
		props = props[len(chunk):]
		o, err := n.proposeChunk(ctx, chunk, deadline, timer.C)
		if err != nil {
			n.metrics.observeFailure(evCount-len(results), err)
			return nil, err
		}
		results = append(results, o.results...)
		lastIndex = max(lastIndex, o.index)
	}
	// Read-your-writes: the leader answered after its own apply; a
	// follower waits for its FSM to reach the entry.
	answered := time.Now()
	if n.fsm.appliedIndex() < lastIndex {
		defer func() { n.metrics.observeStage(stageFollowerApply, time.Since(answered)) }()
	}
	if !n.fsm.waitApplied(lastIndex, ctx.Done(), timer.C) {
		err := fmt.Errorf("cluster: propose: %w (%w): committed at index %d but this node had applied only %d by the deadline",
			ErrUnavailable, ErrNotApplied, lastIndex, n.fsm.appliedIndex())
		n.metrics.observeFailure(evCount, err)
		return results, err
	}
	n.metrics.observeResults(results, time.Since(start).Seconds())
	return results, nil
}

// proposeChunk gets one chunk committed, retrying (same ids) through
// leadership changes and transient failures until the deadline.
func (n *Node) proposeChunk(ctx context.Context, props []fsm.Proposal, deadline time.Time, expired <-chan time.Time) (outcome, error) {
	var lastErr error
	backoff := time.Millisecond
	unavailable := func(cause error) (outcome, error) {
		if cause == nil {
			cause = ctx.Err()
		}
		if cause == nil {
			cause = errors.New("deadline passed")
		}
		return outcome{}, fmt.Errorf("cluster: propose %d events: %w (within %s): %w", len(props), ErrUnavailable, n.cfg.ProposeTimeout, cause)
	}
	for {
		if err := n.usable(); err != nil {
			return outcome{}, err
		}
		if err := ctx.Err(); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return unavailable(lastErr)
			}
			return outcome{}, fmt.Errorf("cluster: propose: %w", err)
		}
		if !time.Now().Before(deadline) {
			return unavailable(lastErr)
		}
		wake := n.leaderWake()
		var queue chan *pending
		if n.raft.State() == raft.Leader {
			queue = n.batcher.in
		} else if addr, _ := n.raft.LeaderWithID(); addr != "" {
			queue = n.forwarder.in
		} else {
			lastErr = errors.New("no leader known")
		}
		if queue != nil {
			p := &pending{props: props, deadline: deadline, done: make(chan outcome, 1), queued: time.Now()}
			select {
			case queue <- p:
			case <-expired:
				return unavailable(lastErr)
			case <-ctx.Done():
				continue // reported at the top of the loop
			case <-n.ctx.Done():
				return outcome{}, ErrClosed
			}
			var o outcome
			select {
			case o = <-p.done:
			case <-expired:
				return unavailable(lastErr)
			case <-ctx.Done():
				continue
			}
			if o.err == nil {
				return o, nil
			}
			if !isRetryable(o.err) {
				return outcome{}, o.err
			}
			lastErr = o.err
		}
		// Wait for a leadership change, or a short backoff when the leader
		// is known but failed us (e.g. a connection that just broke).
		t := time.NewTimer(backoff)
		select {
		case <-wake:
		case <-t.C:
		case <-expired:
			t.Stop()
			return unavailable(lastErr)
		case <-ctx.Done():
		case <-n.ctx.Done():
		}
		t.Stop()
		backoff = min(2*backoff, 20*time.Millisecond)
	}
}

// usable reports why the node cannot take proposals, if it cannot.
func (n *Node) usable() error {
	if err := n.fatalError(); err != nil {
		return err
	}
	if n.ctx.Err() != nil {
		return ErrClosed
	}
	return nil
}

// batcher is the leader's group commit: it turns queued proposals (local
// and forwarded) into log entries of up to maxBatch proposals, with at most
// maxInflightEntries entries in Raft at a time.
//
// Completion does not wait on hashicorp/raft's ApplyFuture: a future whose
// entry sat in raft's FSM queue when Raft shut down is never answered
// (hashicorp/raft#498), which would wedge shutdown. Instead every entry
// carries a token in raft.Log.Extensions; the FSM adapter resolves the entry
// by token when it applies it, and the node fails outstanding entries when
// it stops being leader (they may still commit under the next leader; the
// retry's proposal ids make that harmless) or when Raft shuts down.
type batcher struct {
	n        *Node
	in       chan *pending
	maxBatch int
	slots    chan struct{}
	// nudge asks runNudger for an empty entry (a Raft barrier) after an
	// entry with forwarded proposals committed while nothing else is
	// queued: see runNudger.
	nudge chan struct{}

	mu      sync.Mutex
	waiting map[entryToken]*inflightEntry
	nonce   [8]byte // this incarnation's token prefix: tokens in replayed or foreign entries never match
	seq     uint64
}

type entryToken [16]byte

type inflightEntry struct {
	batch     []*pending
	term      uint64    // the leader term it was submitted in
	submitted time.Time // handed to Raft (stage metrics)
}

func newBatcher(n *Node) *batcher {
	b := &batcher{
		n:        n,
		in:       make(chan *pending, queueDepth),
		maxBatch: n.cfg.MaxBatch,
		slots:    make(chan struct{}, maxInflightEntries),
		waiting:  make(map[entryToken]*inflightEntry),
		nudge:    make(chan struct{}, 1),
	}
	_, _ = rand.Read(b.nonce[:])
	return b
}

// gather is the batcher's and the forwarder's one drain loop: it starts a
// batch with first (or, when first is nil, the next proposal from in,
// waiting for it) and adds what else is queued without waiting, up to max
// proposals. A queued proposal that would overflow the batch comes back as
// carry, to start the next one. ok is false when ctx ended while waiting.
func gather(ctx context.Context, in <-chan *pending, first *pending, max int) (batch []*pending, count int, carry *pending, ok bool) {
	if first == nil {
		select {
		case first = <-in:
		case <-ctx.Done():
			return nil, 0, nil, false
		}
	}
	batch, count = []*pending{first}, len(first.props)
	for count < max {
		select {
		case p := <-in:
			if count+len(p.props) > max {
				return batch, count, p, true
			}
			batch = append(batch, p)
			count += len(p.props)
		default:
			return batch, count, nil, true
		}
	}
	return batch, count, nil, true
}

func (b *batcher) run(ctx context.Context) {
	var carry *pending
	for {
		select {
		case b.slots <- struct{}{}:
		case <-ctx.Done():
			b.failQueued(carry, ErrClosed)
			return
		}
		batch, _, next, ok := gather(ctx, b.in, carry, b.maxBatch)
		carry = next
		if !ok {
			<-b.slots
			b.failQueued(nil, ErrClosed)
			return
		}
		if !b.submit(batch) {
			<-b.slots
		}
	}
}

// submit encodes the live proposals of batch as one entry and hands it to
// Raft; false when nothing was submitted (the caller frees the slot).
func (b *batcher) submit(batch []*pending) bool {
	now := time.Now()
	live := batch[:0]
	for _, p := range batch {
		if !now.Before(p.deadline) {
			p.reply(outcome{err: fmt.Errorf("%w: deadline passed while queued", ErrUnavailable)})
			continue
		}
		live = append(live, p)
	}
	if len(live) == 0 {
		return false
	}
	data, props, live := b.encode(live)
	if len(live) == 0 {
		return false
	}
	b.n.metrics.observeBatch(props)
	for _, p := range live {
		b.n.metrics.observeStage(stageQueue, now.Sub(p.queued))
	}

	term := b.n.raft.CurrentTerm()
	b.mu.Lock()
	b.seq++
	var tok entryToken
	copy(tok[:8], b.nonce[:])
	binary.BigEndian.PutUint64(tok[8:], b.seq)
	b.waiting[tok] = &inflightEntry{batch: live, term: term, submitted: time.Now()}
	b.mu.Unlock()

	b.n.raft.ApplyLog(raft.Log{Data: data, Extensions: tok[:]}, 0)
	// Registered before the check: a leadership change after it is caught
	// by the observer, one before it here.
	b.failStale()
	return true
}

// encode builds the entry; if one caller's event does not encode, that
// caller gets the error and the others go ahead.
func (b *batcher) encode(batch []*pending) ([]byte, int, []*pending) {
	var props []fsm.Proposal
	if len(batch) == 1 {
		props = batch[0].props
	} else {
		for _, p := range batch {
			props = append(props, p.props...)
		}
	}
	data, err := fsm.EncodeEntry(props)
	if err == nil {
		return data, len(props), batch
	}
	ok := batch[:0]
	for _, p := range batch {
		if _, err := fsm.EncodeEntry(p.props); err != nil {
			p.reply(outcome{err: fmt.Errorf("cluster: propose: %w", err)})
			continue
		}
		ok = append(ok, p)
	}
	if len(ok) == 0 {
		return nil, 0, nil
	}
	return b.encode(ok)
}

// take removes the entry for tok, freeing its slot; nil if unknown (another
// incarnation's entry, or already failed).
func (b *batcher) take(tok []byte) *inflightEntry {
	if len(tok) != len(entryToken{}) {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.waiting[entryToken(tok)]
	if e != nil {
		delete(b.waiting, entryToken(tok))
		<-b.slots
	}
	return e
}

// resolve fans an applied entry's results out to its proposals (called by
// the FSM adapter on raft's FSM goroutine; replies never block).
func (b *batcher) resolve(tok []byte, resp *applyResponse) {
	e := b.take(tok)
	if e == nil {
		return
	}
	b.n.metrics.observeStage(stageCommit, time.Since(e.submitted))
	if resp.err != nil {
		err := errHaltedBy(resp.err)
		for _, p := range e.batch {
			p.reply(outcome{err: err})
		}
		return
	}
	off := 0
	for _, p := range e.batch {
		k := len(p.props)
		if off+k > len(resp.results) {
			p.reply(outcome{err: fmt.Errorf("cluster: entry %d: %d results for %d proposals", resp.index, len(resp.results), off+k)})
			continue
		}
		p.reply(outcome{results: resp.results[off : off+k : off+k], index: resp.index})
		off += k
	}
	if len(b.in) == 0 && slices.ContainsFunc(e.batch, func(p *pending) bool { return p.forwarded }) {
		select {
		case b.nudge <- struct{}{}:
		default:
		}
	}
}

// runNudger tells the followers the commit index at once when the pipeline
// is idle. A follower that forwarded a proposal answers its caller only
// after its own FSM applied the entry (read-your-writes), and it learns
// that the entry committed from the leader's next AppendEntries: under
// load that is the next entry, sent at once; on an idle leader it was the
// CommitTimeout heartbeat, 2–4 ms later (hashicorp/raft does not replicate
// on commit). An empty barrier entry triggers replication immediately and
// carries the new commit index; it costs one more small disk write, only
// when nothing else is queued. Measured: idle forwarded bind p50 6.5 ms →
// see BENCHMARKS.md.
func (b *batcher) runNudger(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.nudge:
			if b.n.raft.State() == raft.Leader && len(b.in) == 0 {
				b.n.raft.Barrier(0) // not waited for: only its AppendEntries matter
			}
		}
	}
}

// failAll fails every outstanding entry with err.
func (b *batcher) failAll(err error) {
	b.mu.Lock()
	entries := make([]*inflightEntry, 0, len(b.waiting))
	for tok, e := range b.waiting {
		entries = append(entries, e)
		delete(b.waiting, tok)
		<-b.slots
	}
	b.mu.Unlock()
	for _, e := range entries {
		for _, p := range e.batch {
			p.reply(outcome{err: err})
		}
	}
}

// failStale fails the entries raft may have dropped: all of them when this
// node is not leader, else those submitted in an earlier term (leadership
// lost and regained in between).
func (b *batcher) failStale() {
	leader := b.n.raft.State() == raft.Leader
	term := b.n.raft.CurrentTerm()
	b.mu.Lock()
	var stale []*inflightEntry
	for tok, e := range b.waiting {
		if !leader || e.term != term {
			stale = append(stale, e)
			delete(b.waiting, tok)
			<-b.slots
		}
	}
	b.mu.Unlock()
	if len(stale) == 0 {
		return
	}
	err := b.notLeaderError()
	for _, e := range stale {
		for _, p := range e.batch {
			p.reply(outcome{err: err})
		}
	}
}

func (b *batcher) notLeaderError() error {
	addr, id := b.n.raft.LeaderWithID()
	return retryable(&NotLeaderError{LeaderID: string(id), LeaderAddr: string(addr)})
}

func (b *batcher) failQueued(carry *pending, err error) {
	if carry != nil {
		carry.reply(outcome{err: err})
	}
	for {
		select {
		case p := <-b.in:
			p.reply(outcome{err: err})
		default:
			return
		}
	}
}

// forwarder is a follower's side of group commit: queued proposals go to
// the leader in one frame per flush, with at most maxInflightFrames frames
// outstanding.
type forwarder struct {
	n        *Node
	in       chan *pending
	maxBatch int
	slots    chan struct{}
}

func newForwarder(n *Node) *forwarder {
	return &forwarder{n: n, in: make(chan *pending, queueDepth), maxBatch: n.cfg.MaxBatch, slots: make(chan struct{}, maxInflightFrames)}
}

func (f *forwarder) run(ctx context.Context) {
	var carry *pending
	for {
		select {
		case f.slots <- struct{}{}:
		case <-ctx.Done():
			f.fail(carry)
			return
		}
		batch, count, next, ok := gather(ctx, f.in, carry, f.maxBatch)
		carry = next
		if !ok {
			f.fail(nil)
			return
		}
		f.n.wg.Add(1)
		go func() {
			defer f.n.wg.Done()
			defer func() { <-f.slots }()
			f.send(ctx, batch, count)
		}()
	}
}

func (f *forwarder) fail(carry *pending) {
	if carry != nil {
		carry.reply(outcome{err: ErrClosed})
	}
	for {
		select {
		case p := <-f.in:
			p.reply(outcome{err: ErrClosed})
		default:
			return
		}
	}
}

// send forwards one frame to the current leader and fans out its answer.
func (f *forwarder) send(ctx context.Context, batch []*pending, count int) {
	replyAll := func(o outcome) {
		for _, p := range batch {
			p.reply(o)
		}
	}
	addr, id := f.n.raft.LeaderWithID()
	if addr == "" || string(id) == f.n.id {
		replyAll(outcome{err: retryable(&NotLeaderError{LeaderID: string(id), LeaderAddr: string(addr)})})
		return
	}
	var deadline time.Time
	for _, p := range batch {
		if p.deadline.After(deadline) {
			deadline = p.deadline
		}
	}
	cctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	// Encode per caller so one caller's bad event fails only that caller.
	encoded := make([][][]byte, 0, len(batch))
	good := batch[:0]
	for _, p := range batch {
		evs := make([][]byte, len(p.props))
		var err error
		for i, pr := range p.props {
			if evs[i], err = fsm.EncodeEvent(pr.Event); err != nil {
				break
			}
		}
		if err != nil {
			p.reply(outcome{err: fmt.Errorf("cluster: propose: %w", err)})
			count -= len(p.props)
			continue
		}
		good = append(good, p)
		encoded = append(encoded, evs)
	}
	batch = good
	if len(batch) == 0 {
		return
	}
	ids := make([]fsm.ProposalID, 0, count)
	events := make([][]byte, 0, count)
	for i, p := range batch {
		for j, pr := range p.props {
			ids = append(ids, pr.ID)
			events = append(events, encoded[i][j])
		}
	}
	f.n.metrics.observeForwarded(count)
	sent := time.Now()
	for _, p := range batch {
		f.n.metrics.observeStage(stageQueue, sent.Sub(p.queued))
	}
	index, results, err := f.n.client.Propose(cctx, string(addr), ids, events)
	f.n.metrics.observeStage(stageForward, time.Since(sent))
	var malformed *transport.MalformedResponseError
	if errors.As(err, &malformed) {
		replyAll(outcome{err: fmt.Errorf("cluster: leader %s answered a forwarded batch badly: %w", id, malformed.Err)})
		return
	}
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: forward to leader %s at %s: %w", ErrUnavailable, id, addr, err)
		}
		replyAll(outcome{err: err})
		return
	}
	off := 0
	for _, p := range batch {
		k := len(p.props)
		p.reply(outcome{results: results[off : off+k : off+k], index: index})
		off += k
	}
}
