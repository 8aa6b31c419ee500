package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/fsm"
)

// LogKind selects the affinity log implementation of sim mode.
type LogKind string

const (
	// LogRaft: one real cluster.Node per edge (hashicorp/raft,
	// raft-boltdb/v2 and bbolt files in a temporary directory) over
	// loopback TCP with fast Raft timing.
	LogRaft LogKind = "raft"
	// LogSequencer: one fsm.Machine per edge, fed the same encoded log
	// entries in the same order by one in-process sequencer (no Raft).
	LogSequencer LogKind = "sequencer"
)

// ParseLogKind parses --log.
func ParseLogKind(s string) (LogKind, error) {
	switch LogKind(s) {
	case LogRaft, LogSequencer:
		return LogKind(s), nil
	}
	return "", fmt.Errorf("bench: --log: unknown value %q (allowed: raft, sequencer)", s)
}

// affinityLog is the binding table shared by the edges. Proposals are made
// one at a time from the single-threaded event loop and return once every
// replica applied them, so every edge reads the effect at the same virtual
// instant: commit latency is zero in virtual time (see DESIGN.md).
type affinityLog interface {
	// State is edge e's replica.
	State(edge int) *fsm.State
	// Propose commits evs on behalf of edge e at virtual time now.
	Propose(ctx context.Context, edge int, now time.Time, evs []fsm.Event) ([]fsm.Result, error)
	// Background commits evs whose results no decision reads (Touch): it
	// may return before they commit. Drain waits for them.
	Background(ctx context.Context, edge int, now time.Time, evs []fsm.Event) error
	Drain(ctx context.Context) error
	// Commits counts the events committed by Propose and Background.
	Commits() int
	Close(ctx context.Context) error
}

// sequencerLog applies every entry to one fsm.Machine per replica, in one
// order, with the virtual time as the entry time.
type sequencerLog struct {
	machines []*fsm.Machine
	index    uint64
	nextID   uint64
	commits  int
}

func newSequencerLog(replicas int) *sequencerLog {
	l := &sequencerLog{}
	for i := 0; i < replicas; i++ {
		l.machines = append(l.machines, fsm.NewMachine())
	}
	return l
}

func (l *sequencerLog) State(edge int) *fsm.State { return l.machines[edge].State() }

func (l *sequencerLog) Propose(_ context.Context, _ int, now time.Time, evs []fsm.Event) ([]fsm.Result, error) {
	props := make([]fsm.Proposal, len(evs))
	for i, ev := range evs {
		l.nextID++
		var id fsm.ProposalID
		for b := 0; b < 8; b++ {
			id[b] = byte(l.nextID >> (8 * b))
		}
		props[i] = fsm.Proposal{ID: id, Event: ev}
	}
	data, err := fsm.EncodeEntry(props)
	if err != nil {
		return nil, fmt.Errorf("bench: sequencer: %w", err)
	}
	l.index++
	entry := fsm.Entry{Index: l.index, Time: now.UnixNano(), Data: data}
	var out []fsm.Result
	for i, m := range l.machines {
		rs, err := m.Apply(entry)
		if err != nil {
			return nil, fmt.Errorf("bench: sequencer: replica %d: apply entry %d: %w", i, l.index, err)
		}
		if i == 0 {
			out = rs
		}
	}
	l.commits += len(evs)
	return out, nil
}

func (l *sequencerLog) Background(ctx context.Context, edge int, now time.Time, evs []fsm.Event) error {
	_, err := l.Propose(ctx, edge, now, evs)
	return err
}

func (l *sequencerLog) Drain(context.Context) error { return nil }
func (l *sequencerLog) Commits() int                { return l.commits }
func (l *sequencerLog) Close(context.Context) error { return nil }

// raftLog is a real cluster: one node per edge on loopback TCP.
type raftLog struct {
	nodes   []*cluster.Node
	dir     string
	commits int

	// Background proposals run on one goroutine, in order, so the event
	// loop blocks only on proposals whose results routing reads.
	bg       chan bgProposal
	bgDone   chan struct{}
	bgMu     sync.Mutex
	bgErr    error
	bgCount  int
	bgWG     sync.WaitGroup
	bgCancel context.CancelFunc
}

type bgProposal struct {
	edge int
	evs  []fsm.Event
}

// benchRaftTiming elects quickly yet tolerates a loaded 2-core machine.
var benchRaftTiming = cluster.RaftTiming{
	HeartbeatTimeout:   200 * time.Millisecond,
	ElectionTimeout:    200 * time.Millisecond,
	LeaderLeaseTimeout: 100 * time.Millisecond,
	CommitTimeout:      time.Millisecond,
}

func newRaftLog(ctx context.Context, replicas int) (_ *raftLog, err error) {
	dir, err := os.MkdirTemp("", "tether-bench-raft-")
	if err != nil {
		return nil, fmt.Errorf("bench: raft log: %w", err)
	}
	l := &raftLog{dir: dir, bg: make(chan bgProposal, 1024), bgDone: make(chan struct{})}
	bgCtx, bgCancel := context.WithCancel(context.Background())
	l.bgCancel = bgCancel
	go l.runBackground(bgCtx)
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err = errors.Join(err, l.Close(cctx))
		}
	}()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	lns := make([]net.Listener, replicas)
	peers := make([]cluster.Peer, replicas)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			for _, o := range lns[:i] {
				o.Close()
			}
			return nil, fmt.Errorf("bench: raft log: listen: %w", err)
		}
		lns[i] = ln
		peers[i] = cluster.Peer{ID: fmt.Sprintf("edge-%d", i), Addr: ln.Addr().String()}
	}
	nodes := make([]*cluster.Node, replicas)
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes[i], errs[i] = cluster.Open(ctx, cluster.Config{
				NodeID:         peers[i].ID,
				DataDir:        filepath.Join(dir, peers[i].ID),
				Listener:       lns[i],
				Bootstrap:      true,
				Peers:          peers,
				AuthKey:        key,
				ProposeTimeout: 10 * time.Second,
				Raft:           benchRaftTiming,
				Version:        "bench",
			})
		}()
	}
	wg.Wait()
	for _, n := range nodes {
		if n != nil {
			l.nodes = append(l.nodes, n)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("bench: raft log: %w", err)
	}
	// Wait for a leader so the first proposal does not race an election.
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, n := range l.nodes {
			if n.IsLeader() {
				return l, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("bench: raft log: waiting for a leader: %w", ctx.Err())
		case <-deadline.C:
			return nil, errors.New("bench: raft log: no leader elected within 30s")
		case <-tick.C:
		}
	}
}

func (l *raftLog) State(edge int) *fsm.State { return l.nodes[edge].State() }

func (l *raftLog) Propose(ctx context.Context, edge int, _ time.Time, evs []fsm.Event) ([]fsm.Result, error) {
	n := l.nodes[edge]
	rs, err := n.ProposeBatch(ctx, evs)
	if err != nil {
		return nil, fmt.Errorf("bench: raft log: propose via %s: %w", n.ID(), err)
	}
	// Every replica applies the entry before the next virtual event, so
	// all edges read it at the same virtual instant (deterministic).
	index := n.State().Index()
	for _, o := range l.nodes {
		if err := o.WaitApplied(ctx, index); err != nil {
			return nil, fmt.Errorf("bench: raft log: %s: %w", o.ID(), err)
		}
	}
	l.commits += len(evs)
	return rs, nil
}

func (l *raftLog) runBackground(ctx context.Context) {
	defer close(l.bgDone)
	for p := range l.bg {
		// Coalesce what queued up meanwhile: one entry per edge carries
		// every pending event of that edge (each still counts).
		batch := map[int][]fsm.Event{p.edge: p.evs}
		order := []int{p.edge}
		n := 1
	more:
		for {
			select {
			case q, ok := <-l.bg:
				if !ok {
					break more
				}
				if _, seen := batch[q.edge]; !seen {
					order = append(order, q.edge)
				}
				batch[q.edge] = append(batch[q.edge], q.evs...)
				n++
			default:
				break more
			}
		}
		for _, edge := range order {
			evs := batch[edge]
			_, err := l.nodes[edge].ProposeBatch(ctx, evs)
			l.bgMu.Lock()
			if err != nil && l.bgErr == nil {
				l.bgErr = fmt.Errorf("bench: raft log: background propose via %s: %w", l.nodes[edge].ID(), err)
			}
			if err == nil {
				l.bgCount += len(evs)
			}
			l.bgMu.Unlock()
		}
		l.bgWG.Add(-n)
	}
}

func (l *raftLog) Background(ctx context.Context, edge int, _ time.Time, evs []fsm.Event) error {
	l.bgMu.Lock()
	err := l.bgErr
	l.bgMu.Unlock()
	if err != nil {
		return err
	}
	l.bgWG.Add(1)
	select {
	case l.bg <- bgProposal{edge: edge, evs: evs}:
		return nil
	case <-ctx.Done():
		l.bgWG.Done()
		return fmt.Errorf("bench: raft log: background propose: %w", ctx.Err())
	}
}

// Drain waits until every background proposal committed.
func (l *raftLog) Drain(ctx context.Context) error {
	done := make(chan struct{})
	go func() { l.bgWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("bench: raft log: drain: %w", ctx.Err())
	}
	l.bgMu.Lock()
	defer l.bgMu.Unlock()
	return l.bgErr
}

func (l *raftLog) Commits() int {
	l.bgMu.Lock()
	defer l.bgMu.Unlock()
	return l.commits + l.bgCount
}

func (l *raftLog) Close(ctx context.Context) error {
	var errs []error
	if l.bg != nil {
		close(l.bg)
		l.bgCancel() // abandon what is still queued: the run failed or is over
		<-l.bgDone
		l.bg = nil
	}
	for _, n := range l.nodes {
		if err := n.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("bench: raft log: close %s: %w", n.ID(), err))
		}
	}
	l.nodes = nil
	if l.dir != "" {
		if err := os.RemoveAll(l.dir); err != nil {
			errs = append(errs, fmt.Errorf("bench: raft log: %w", err))
		}
		l.dir = ""
	}
	return errors.Join(errs...)
}
