package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
)

// Progress is told how far a long operation got, in abstract units (log
// indexes for a replay); internal/progress's Bar draws it.
type Progress interface {
	Start(total uint64)
	Update(done uint64)
	Done()
}

// ReplayOptions bound a replay.
type ReplayOptions struct {
	// UntilIndex stops after the last entry at or below it (0: the end).
	UntilIndex uint64
	// UntilTime stops before the first entry whose log time is after it
	// (zero: no limit).
	UntilTime time.Time
	// Progress, when set, is told how far the replay got.
	Progress Progress
	// MaxMismatches bounds the outcome mismatches kept in the result
	// (default 20; all are counted).
	MaxMismatches int
}

// StartPoint is where a replay began.
type StartPoint struct {
	// Snapshot is the snapshot loaded first; nil means the empty state.
	Snapshot   *Snapshot
	StateIndex uint64 // the state's index after loading (0 for empty)
	StateHash  [32]byte
}

func (s StartPoint) String() string {
	if s.Snapshot == nil {
		return "the empty state"
	}
	return fmt.Sprintf("snapshot %s (raft index %d, term %d; state index %d)", s.Snapshot.ID, s.Snapshot.Index, s.Snapshot.Term, s.StateIndex)
}

// OutcomeMismatch is a proposal whose replayed outcome differs from the one
// the archive recorded when the live node applied it.
type OutcomeMismatch struct {
	Index    uint64 `json:"index"`
	Proposal int    `json:"proposal"`
	Archived string `json:"archived"`
	Replayed string `json:"replayed"`
}

func (m OutcomeMismatch) String() string {
	return fmt.Sprintf("index %d proposal %d: archived %s, replayed %s", m.Index, m.Proposal, m.Archived, m.Replayed)
}

// Result is a finished (or stopped) replay.
type Result struct {
	State *fsm.State
	Hash  [32]byte
	Index uint64    // state index reached
	Time  time.Time // log time reached (zero for the empty state)
	Start StartPoint
	// Bounds is what the data directory held.
	Bounds Bounds
	// Entries applied, by source; Events is their proposals.
	FromArchive, FromRaftLog int
	Events                   int
	// Mismatches (first MaxMismatches) and MismatchCount compare each
	// archived outcome with the replay's: a healthy archive has none.
	Mismatches    []OutcomeMismatch
	MismatchCount int
	// Notes explain the sources in plain words: the trimmed range, the
	// snapshot used, entries present in raft.db past the archive.
	Notes []string
}

// HashHex is the state hash in hex.
func (r *Result) HashHex() string { return fmt.Sprintf("%x", r.Hash) }

// ReplayError is a replay that could not finish: the entry at Index did
// not apply (corrupt, or an event this build does not know). Partial holds
// what was rebuilt up to the entry before.
type ReplayError struct {
	Index   uint64
	Err     error
	Partial *Result
}

func (e *ReplayError) Error() string {
	return fmt.Sprintf("audit: replay stopped at index %d: %v", e.Index, e.Err)
}

func (e *ReplayError) Unwrap() error { return e.Err }

// replayBatch is how many entries go to the machine per ApplyBatch (one
// state publication each).
const replayBatch = 256

// Replay rebuilds the state into a throwaway fsm.Machine. Where the archive
// is complete it replays from the empty state; where retention trimmed it
// (or the node restored a snapshot), it loads the newest usable snapshot
// and replays what follows it — from raft.db for a gap between the
// snapshot and the archive, from the archive after that.
func (d *DataDir) Replay(ctx context.Context, opts ReplayOptions) (*Result, error) {
	if opts.MaxMismatches <= 0 {
		opts.MaxMismatches = 20
	}
	b, err := d.Bounds()
	if err != nil {
		return nil, err
	}
	res := &Result{Bounds: b}
	m, plan, err := d.start(b, opts)
	if err != nil {
		return nil, err
	}
	res.Start, res.Notes, res.State = plan.start, plan.notes, m.State()
	rp := &replayer{ctx: ctx, opts: opts, m: m, plan: plan, res: res, startIndex: plan.start.StateIndex}
	if !opts.UntilTime.IsZero() {
		rp.untilTime = opts.UntilTime.UnixNano()
	}
	rp.startProgress(b)
	err = d.feed(rp)
	if err == nil || errors.Is(err, errStopReplay) && rp.applyErr == nil {
		if ferr := rp.flush(); ferr != nil {
			err = ferr
		}
	}
	if opts.Progress != nil {
		opts.Progress.Done()
	}
	st := m.State()
	res.State, res.Hash, res.Index = st, st.Hash(), st.Index()
	if st.Time() != 0 {
		res.Time = time.Unix(0, st.Time()).UTC()
	}
	if rp.applyErr != nil {
		var re *ReplayError
		errors.As(rp.applyErr, &re)
		re.Partial = res
		return res, re
	}
	if err != nil && !errors.Is(err, errStopReplay) {
		return res, fmt.Errorf("audit: replay: %w", err)
	}
	if b.RaftLast > b.ArchiveLast && b.ArchiveLast != 0 && opts.UntilIndex == 0 && opts.UntilTime.IsZero() {
		res.Notes = append(res.Notes, fmt.Sprintf(
			"raft.db holds log entries up to index %d, past the archive's last record %d; they are not replayed "+
				"(a copy does not say whether they were committed; a running node archives them once applied)", b.RaftLast, b.ArchiveLast))
	}
	return res, nil
}

// errStopReplay ends the feed at the replay's bound (index or time).
var errStopReplay = errors.New("stop")

// replayer applies the entries of one replay in batches and compares the
// archived outcomes with the machine's.
type replayer struct {
	ctx        context.Context
	opts       ReplayOptions
	m          *fsm.Machine
	plan       replayPlan
	res        *Result
	untilTime  int64
	startIndex uint64

	batch    []fsm.Entry
	outcomes [][]archive.Outcome // nil element: entry not from the archive
	applyErr error
}

func (rp *replayer) startProgress(b Bounds) {
	if rp.opts.Progress == nil {
		return
	}
	lastIndex := b.ArchiveLast
	if rp.opts.UntilIndex != 0 && rp.opts.UntilIndex < lastIndex {
		lastIndex = rp.opts.UntilIndex
	}
	total := uint64(0)
	if lastIndex > rp.startIndex {
		total = lastIndex - rp.startIndex
	}
	rp.opts.Progress.Start(total)
}

// feed hands the replay the raft.db entries between the start and the
// archive, then the archive's records.
func (d *DataDir) feed(rp *replayer) error {
	plan := rp.plan
	if plan.raftTo > plan.after {
		if err := d.raftEntries(plan.after+1, plan.raftTo, func(e fsm.Entry) error { return rp.add(e, nil) }); err != nil {
			return err
		}
	}
	from := max(plan.after, plan.raftTo) + 1
	return d.archive.Range(from, 0, func(r archive.Record) error {
		out := r.Outcomes
		if out == nil {
			out = []archive.Outcome{}
		}
		return rp.add(fsm.Entry{Index: r.Index, Time: r.Time, Data: r.Data}, out)
	})
}

// add queues one entry (out: its archived outcomes, nil for a raft.db
// entry); errStopReplay past the replay's bound.
func (rp *replayer) add(e fsm.Entry, out []archive.Outcome) error {
	if rp.opts.UntilIndex != 0 && e.Index > rp.opts.UntilIndex {
		return errStopReplay
	}
	if rp.untilTime != 0 && e.Time > rp.untilTime {
		return errStopReplay
	}
	if e.Index <= rp.plan.after {
		return nil
	}
	rp.batch = append(rp.batch, e)
	rp.outcomes = append(rp.outcomes, out)
	if len(rp.batch) >= replayBatch {
		return rp.flush()
	}
	return nil
}

// flush applies the queued entries and compares their outcomes.
func (rp *replayer) flush() error {
	if len(rp.batch) == 0 {
		return nil
	}
	rs, err := rp.m.ApplyBatch(rp.batch)
	for i, r := range rs {
		if rp.outcomes[i] != nil {
			rp.res.FromArchive++
			compareOutcomes(rp.res, rp.batch[i].Index, rp.outcomes[i], r, rp.opts.MaxMismatches)
		} else {
			rp.res.FromRaftLog++
		}
		rp.res.Events += len(r)
	}
	if err != nil {
		rp.applyErr = &ReplayError{Index: rp.batch[len(rs)].Index, Err: err}
		return errStopReplay
	}
	if rp.opts.Progress != nil {
		if idx := rp.batch[len(rp.batch)-1].Index; idx > rp.startIndex {
			rp.opts.Progress.Update(idx - rp.startIndex)
		}
	}
	rp.batch, rp.outcomes = rp.batch[:0], rp.outcomes[:0]
	return rp.ctx.Err()
}

// replayPlan says where a replay starts and which source covers what.
type replayPlan struct {
	start StartPoint
	// after: entries at or below this Raft index are covered by the start
	// point (the snapshot's Raft index, or 0).
	after uint64
	// raftTo: entries in (after, raftTo] come from raft.db (the archive
	// no longer holds them); the archive covers everything after.
	raftTo uint64
	notes  []string
}

// start picks the start point and loads it into a new machine.
func (d *DataDir) start(b Bounds, opts ReplayOptions) (*fsm.Machine, replayPlan, error) {
	horizon := b.TrimmedTo // the archive is complete above this index
	var notes []string
	if b.TrimmedTo != 0 {
		notes = append(notes, fmt.Sprintf("the archive's retention trimmed indexes %d..%d; the state before them comes from a snapshot",
			b.TrimmedFrom, b.TrimmedTo))
	}
	restoredAt := uint64(0)
	if len(b.Restores) > 0 {
		restoredAt = slices.Max(b.Restores)
		notes = append(notes, fmt.Sprintf("this node restored its state from a snapshot at state index %d; the archive may lack entries before it, "+
			"so replay starts from a snapshot taken at or after the restore", restoredAt))
		horizon = max(horizon, restoredAt)
	}
	raftCovers := func(from, to uint64) bool { // raft.db holds every index in [from, to]
		return from > to || (b.RaftFirst != 0 && b.RaftFirst <= from && b.RaftLast >= to)
	}
	untilOK := func(st *fsm.State) bool {
		if opts.UntilIndex != 0 && st.Index() > opts.UntilIndex {
			return false
		}
		return opts.UntilTime.IsZero() || st.Time() <= opts.UntilTime.UnixNano()
	}
	if horizon == 0 {
		return fsm.NewMachine(), replayPlan{notes: notes}, nil
	}
	var tried []string
	for i := len(b.Snapshots) - 1; i >= 0; i-- {
		s := b.Snapshots[i]
		if !raftCovers(s.Index+1, horizon) {
			tried = append(tried, fmt.Sprintf("%s ends at raft index %d, before the archive resumes", s.ID, s.Index))
			continue
		}
		m := fsm.NewMachine()
		if err := s.RestoreInto(m); err != nil {
			tried = append(tried, err.Error())
			continue
		}
		st := m.State()
		if restoredAt != 0 && st.Index() < restoredAt {
			tried = append(tried, fmt.Sprintf("%s holds state index %d, before the restore at %d", s.ID, st.Index(), restoredAt))
			continue
		}
		if !untilOK(st) {
			tried = append(tried, fmt.Sprintf("%s is past the requested end (state index %d)", s.ID, st.Index()))
			continue
		}
		snap := s
		plan := replayPlan{start: StartPoint{Snapshot: &snap, StateIndex: st.Index(), StateHash: st.Hash()}, after: s.Index, notes: notes}
		if horizon > s.Index {
			plan.raftTo = horizon
			plan.notes = append(plan.notes, fmt.Sprintf("entries %d..%d come from raft.db (between the snapshot and the archive)", s.Index+1, horizon))
		}
		plan.notes = append(plan.notes, fmt.Sprintf("replay starts from %s and continues with the archive after index %d", plan.start, max(s.Index, horizon)))
		return m, plan, nil
	}
	if restoredAt == 0 && raftCovers(1, horizon) {
		notes = append(notes, fmt.Sprintf("no usable snapshot; entries 1..%d come from raft.db", horizon))
		return fsm.NewMachine(), replayPlan{raftTo: horizon, notes: notes}, nil
	}
	why := "there is no snapshot in " + snapshotStorePath(d.dir)
	if len(tried) > 0 {
		why = "no snapshot is usable: " + strings.Join(tried, "; ")
	}
	raftHas := "no raft.db"
	if b.RaftFirst != 0 {
		raftHas = fmt.Sprintf("raft.db holds only %d..%d", b.RaftFirst, b.RaftLast)
	}
	return nil, replayPlan{}, fmt.Errorf("audit: cannot rebuild the state: the archive is complete only after index %d (%s), %s, and %s",
		horizon, strings.Join(notes, "; "), why, raftHas)
}

// compareOutcomes checks one entry's replayed results against the outcomes
// the archive recorded for it.
func compareOutcomes(res *Result, index uint64, archived []archive.Outcome, replayed []fsm.Result, keep int) {
	// An archived list shorter than the entry belongs to a node that
	// halted part-way through it; compare what both have.
	for i := range min(len(archived), len(replayed)) {
		if archived[i].Status == fsm.StatusApplied && replayed[i].Status == fsm.StatusSuperseded {
			// Archived before the status existed: a losing Bind was
			// recorded as applied (a no-op either way).
			archived[i].Status = fsm.StatusSuperseded
		}
		a := describeOutcome(archived[i].Status, archived[i].Reason, archived[i].Evicted)
		r := describeOutcome(replayed[i].Status, replayed[i].Reason, replayed[i].Evicted)
		if a == r {
			continue
		}
		res.MismatchCount++
		if len(res.Mismatches) < keep {
			res.Mismatches = append(res.Mismatches, OutcomeMismatch{Index: index, Proposal: i, Archived: a, Replayed: r})
		}
	}
}

func describeOutcome(s fsm.Status, reason string, ev []fsm.Evicted) string {
	var b strings.Builder
	b.WriteString(s.String())
	if reason != "" {
		fmt.Fprintf(&b, " (%s)", reason)
	}
	for _, e := range ev {
		fmt.Fprintf(&b, " evicted %s/%q from %s epoch %d (%s)", e.Fleet, e.Key, e.Instance, e.Epoch, e.Reason)
	}
	return b.String()
}
