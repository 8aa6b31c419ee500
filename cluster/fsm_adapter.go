package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
)

// applyResponse is what ApplyBatch hands back for one command log: the
// per-proposal results, or the error that stopped the node.
type applyResponse struct {
	index   uint64
	results []fsm.Result
	err     error
}

// appliedView is published after every applied batch: the state, and the
// Raft position it corresponds to.
type appliedView struct {
	state       *fsm.State
	index       uint64 // last Raft index processed (commands and configurations)
	commandTerm uint64 // term of the entry at state.Index()
}

// raftFSM adapts fsm.Machine (and the archive) to raft.BatchingFSM. All
// mutating methods run on raft's single FSM goroutine.
type raftFSM struct {
	machine  *fsm.Machine
	archiver *archiver
	selfID   string
	log      *slog.Logger
	metrics  *metrics

	// snapshotConfig returns the configuration stored with the newest
	// snapshot (for membership tracking after an installed snapshot).
	snapshotConfig func() (raft.Configuration, uint64, bool)
	onHalt         func(err error)                 // the machine stopped: report and shut down (async)
	onRemoved      func(index uint64)              // a committed configuration dropped this node
	onRestored     func(snapshotStateIndex uint64) // state replaced from a snapshot
	// onApplied receives each command entry's response with the entry's
	// raft.Log.Extensions (the leader's batcher token), after publication.
	onApplied func(extensions []byte, resp *applyResponse)

	view atomic.Pointer[appliedView]
	// hashes holds the state hash after each recently applied entry.
	hashes *recentHashes
	// halt is the error that stopped this node's apply (the machine's, or
	// an archive failure); permanent for the process.
	halt atomic.Pointer[error]

	// wasMember: some configuration seen so far included this node; a
	// later one without it means removal (a joining node first replays
	// configurations from before its join, which must not count).
	wasMember bool

	waitMu sync.Mutex
	waitCh chan struct{} // closed and replaced whenever the applied index moves
}

func newRaftFSM(m *fsm.Machine, ar *archiver, selfID string, logger *slog.Logger, met *metrics, hashHistory int) *raftFSM {
	f := &raftFSM{machine: m, archiver: ar, selfID: selfID, log: logger, metrics: met, waitCh: make(chan struct{}), hashes: newRecentHashes(hashHistory)}
	f.view.Store(&appliedView{state: m.State()})
	return f
}

var _ raft.BatchingFSM = (*raftFSM)(nil)

func (f *raftFSM) current() *appliedView { return f.view.Load() }

// appliedIndex is the last Raft index this node's FSM processed.
func (f *raftFSM) appliedIndex() uint64 { return f.view.Load().index }

// changed returns a channel closed at the next applied-index change.
func (f *raftFSM) changed() <-chan struct{} {
	f.waitMu.Lock()
	defer f.waitMu.Unlock()
	return f.waitCh
}

func (f *raftFSM) publish(v *appliedView) {
	f.view.Store(v)
	f.metrics.setApplied(v.index)
	f.waitMu.Lock()
	close(f.waitCh)
	f.waitCh = make(chan struct{})
	f.waitMu.Unlock()
}

// halted returns the error that stopped apply, or nil.
func (f *raftFSM) halted() error {
	if p := f.halt.Load(); p != nil {
		return *p
	}
	if err := f.archiver.err(); err != nil {
		return err
	}
	return f.machine.Halted()
}

// Apply is the non-batching path (raft uses ApplyBatch; kept for the
// interface).
func (f *raftFSM) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch applies the command logs as one machine batch (one state
// publication), archives them in one bbolt transaction, and returns one
// response per log. Configuration logs only feed membership tracking.
func (f *raftFSM) ApplyBatch(logs []*raft.Log) []interface{} {
	resp := make([]interface{}, len(logs))
	prev := f.current()
	if err := f.halted(); err != nil {
		for i := range resp {
			resp[i] = &applyResponse{index: logs[i].Index, err: err}
		}
		f.deliver(logs, resp)
		return resp
	}
	entries, positions := commandEntries(logs)
	var (
		results  [][]fsm.Result
		hashes   [][32]byte
		applyErr error
	)
	if len(entries) > 0 {
		results, hashes, applyErr = f.machine.ApplyBatchHashed(entries)
		for i, h := range hashes {
			f.hashes.add(entries[i].Index, h)
		}
	}
	next := f.respond(logs, resp, prev, entries, positions, results, applyErr)
	f.publish(next)
	applied := time.Now()
	for i := range results {
		f.metrics.observeApplied(logs[positions[i]].AppendedAt, applied)
	}
	f.deliver(logs, resp)
	// Archive what was applied (one bbolt transaction per batch, or per
	// several when the archiver is behind), after the answers went out.
	if len(results) > 0 {
		recs := make([]archive.Record, len(results))
		for i, rs := range results {
			e := entries[i]
			recs[i] = archive.Record{Index: e.Index, Time: e.Time, Data: e.Data, Outcomes: archive.OutcomesFromResults(rs)}
		}
		f.archiver.enqueue(recs)
	}
	if applyErr != nil {
		f.halt.CompareAndSwap(nil, &applyErr)
		f.onHalt(applyErr)
	}
	return resp
}

// commandEntries are the machine entries of the command logs, and each
// one's position in logs.
func commandEntries(logs []*raft.Log) ([]fsm.Entry, []int) {
	entries := make([]fsm.Entry, 0, len(logs))
	positions := make([]int, 0, len(logs))
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		var t int64
		if !l.AppendedAt.IsZero() {
			t = l.AppendedAt.UnixNano()
		}
		entries = append(entries, fsm.Entry{Index: l.Index, Time: t, Data: l.Data})
		positions = append(positions, i)
	}
	return entries, positions
}

// respond fills resp, one response per log, from the machine's results
// (a command it did not apply answers applyErr), feeds configuration logs
// to membership tracking, and returns the view to publish: the last index
// processed (nothing at or after the first command the machine did not
// apply) and the term of the last command applied.
func (f *raftFSM) respond(logs []*raft.Log, resp []interface{}, prev *appliedView, entries []fsm.Entry, positions []int,
	results [][]fsm.Result, applyErr error) *appliedView {
	next := &appliedView{state: f.machine.State(), index: prev.index, commandTerm: prev.commandTerm}
	for i, rs := range results {
		l := logs[positions[i]]
		resp[positions[i]] = &applyResponse{index: l.Index, results: rs}
		next.commandTerm = l.Term
	}
	stopAt := uint64(1<<64 - 1)
	if len(results) < len(entries) {
		stopAt = entries[len(results)].Index
	}
	for i, l := range logs {
		switch {
		case resp[i] != nil:
			next.index = max(next.index, l.Index)
		case l.Type == raft.LogCommand:
			resp[i] = &applyResponse{index: l.Index, err: applyErr}
		case l.Index < stopAt:
			if l.Type == raft.LogConfiguration {
				f.observeConfiguration(l)
			}
			next.index = max(next.index, l.Index)
		}
	}
	return next
}

// deliver hands command responses to their waiting proposers.
func (f *raftFSM) deliver(logs []*raft.Log, resp []interface{}) {
	if f.onApplied == nil {
		return
	}
	for i, l := range logs {
		if l.Type != raft.LogCommand || len(l.Extensions) == 0 {
			continue
		}
		if r, ok := resp[i].(*applyResponse); ok {
			f.onApplied(l.Extensions, r)
		}
	}
}

func (f *raftFSM) observeConfiguration(l *raft.Log) {
	cfg, err := decodeConfiguration(l.Data)
	if err != nil {
		f.log.Error("cluster: undecodable configuration entry", "index", l.Index, "err", err)
		return
	}
	f.noteConfiguration(cfg, l.Index)
}

func (f *raftFSM) noteConfiguration(cfg raft.Configuration, index uint64) {
	member := false
	for _, s := range cfg.Servers {
		if string(s.ID) == f.selfID {
			member = true
			break
		}
	}
	if member {
		f.wasMember = true
		return
	}
	if f.wasMember && f.onRemoved != nil {
		f.onRemoved(index)
	}
}

// decodeConfiguration wraps raft.DecodeConfiguration, which panics on bad
// input, so a corrupt entry is an error here rather than a crash.
func decodeConfiguration(b []byte) (cfg raft.Configuration, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("decode raft configuration: %v", r)
		}
	}()
	return raft.DecodeConfiguration(b), nil
}

// Snapshot captures the immutable state (cheap); Persist streams it.
func (f *raftFSM) Snapshot() (raft.FSMSnapshot, error) {
	if err := f.halted(); err != nil {
		// The state stopped short of raft's applied index: a snapshot would
		// claim entries this node never applied.
		return nil, fmt.Errorf("cluster: no snapshot from a halted state machine: %w", err)
	}
	return &stateSnapshot{state: f.machine.State(), archiver: f.archiver}, nil
}

// Restore replaces the state from a snapshot stream (raft's install or user
// restore path, or restart).
func (f *raftFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	if err := f.machine.Restore(bufio.NewReaderSize(rc, 256<<10)); err != nil {
		return fmt.Errorf("cluster: restore snapshot: %w", err)
	}
	st := f.machine.State()
	index := st.Index()
	f.hashes.reset()
	f.hashes.add(st.Index(), st.Hash())
	if f.snapshotConfig != nil {
		if cfg, snapIndex, ok := f.snapshotConfig(); ok {
			index = max(index, snapIndex)
			f.noteConfiguration(cfg, snapIndex)
		}
	}
	f.publish(&appliedView{state: st, index: index, commandTerm: f.current().commandTerm})
	f.archiver.restored(st.Index())
	if f.onRestored != nil {
		f.onRestored(st.Index())
	}
	return nil
}

type stateSnapshot struct {
	state    *fsm.State
	archiver *archiver
}

// snapshotArchiveWait bounds how long Persist waits for the archive.
const snapshotArchiveWait = time.Minute

func (s *stateSnapshot) Persist(sink raft.SnapshotSink) error {
	// The log behind this snapshot is about to be compacted: the archive
	// must already hold it.
	if err := s.archiver.waitArchived(s.state.Index(), snapshotArchiveWait); err != nil {
		sink.Cancel()
		return fmt.Errorf("cluster: persist snapshot at state index %d: %w", s.state.Index(), err)
	}
	w := bufio.NewWriterSize(sink, 256<<10)
	err := s.state.WriteSnapshot(w)
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		sink.Cancel()
		return fmt.Errorf("cluster: persist snapshot at state index %d: %w", s.state.Index(), err)
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("cluster: close snapshot sink: %w", err)
	}
	return nil
}

func (s *stateSnapshot) Release() {}

// errHaltedBy wraps the machine's error as ErrHalted.
func errHaltedBy(err error) error {
	if err == nil || errors.Is(err, ErrHalted) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrHalted, err)
}

// waitApplied blocks until the FSM processed index, or done/timeout fires.
func (f *raftFSM) waitApplied(index uint64, done <-chan struct{}, timeout <-chan time.Time) bool {
	for {
		ch := f.changed()
		if f.appliedIndex() >= index {
			return true
		}
		select {
		case <-ch:
		case <-done:
			return false
		case <-timeout:
			return false
		}
	}
}
