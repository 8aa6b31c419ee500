// Package cluster runs the Raft group that replicates tether's affinity log:
// hashicorp/raft with raft-boltdb/v2 and file snapshots, group commit,
// idempotent proposals forwarded by followers to the leader, membership and
// autopilot, and the bbolt event archive (cluster/archive). Its network —
// one multiplexed, authenticated port per node carrying Raft and the
// forwarding RPC — is cluster/transport. See DESIGN.md.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/cluster/boltfile"
	"github.com/tether-project/tether/cluster/transport"
	"github.com/tether-project/tether/fsm"
)

const (
	raftDBFile      = "raft.db"
	snapshotsDir    = "snapshots"
	archiveFile     = "archive.db"
	snapshotsRetain = 2
	// transportTimeout is hashicorp/raft's per-RPC I/O deadline (scaled up
	// for snapshot installs).
	transportTimeout = 10 * time.Second
	logCacheSize     = 1024
)

// Node is one member of the Raft group.
type Node struct {
	cfg  Config
	log  *slog.Logger
	hlog hclog.Logger
	id   string
	addr string

	raft      *raft.Raft
	transport *raft.NetworkTransport
	store     *raftboltdb.BoltStore
	// storeWatch is store as Raft writes it (storewatch.go).
	storeWatch *storeWatch
	snaps      *raft.FileSnapshotStore
	machine    *fsm.Machine
	fsm        *raftFSM
	archive    *archive.Archive
	archiver   *archiver
	net        *transport.Transport // the node's port: Raft streams and forwarding
	client     *transport.Client
	metrics    *metrics
	batcher    *batcher
	forwarder  *forwarder
	// pilot runs raft-autopilot while this node leads; set once NewRaft
	// returned (a halt during NewRaft's restore may call setReady before).
	pilot atomic.Pointer[pilot]

	// ctx lives as long as the node: Close/Kill cancel it, which stops the
	// batcher, the forwarder, the leadership loop and forwarding handlers.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// removedIDs: member id → index of its removal, as this node (while
	// leader) removed them; add-voter names it in its refusal.
	removedIDs sync.Map

	started  atomic.Bool // NewRaft returned (restores after this come from peers or the operator)
	ready    atomic.Bool // leader and its barrier completed
	readyMu  sync.Mutex  // serialises setReady's latest-value-wins send
	leaderCh chan bool

	wakeMu sync.Mutex
	wakeCh chan struct{} // closed at every observed leader/state change

	fatalCh   chan error
	fatalErr  atomic.Pointer[error]
	fatalOnce sync.Once
	// raftStopping is won by whoever shuts Raft down first (Close/Kill, or
	// a halt/removal on raft's own goroutines); raftStopped closes when the
	// shutdown finished. Not a sync.Once: a halt arriving on raft's FSM
	// goroutine while Close waits for that goroutine would deadlock on it.
	raftStopping atomic.Bool
	// stopping is set when Close or Kill starts (raft's shutdown errors are
	// expected from then on).
	stopping atomic.Bool
	// noTransfer: Close skips the leadership transfer (SkipLeadershipTransfer).
	noTransfer  atomic.Bool
	raftStopped chan struct{}
	// raftSet closes once Open assigned n.raft (or NewRaft failed): a halt
	// can arrive on raft's goroutines while NewRaft itself is still
	// restoring, and its shutdown must not read n.raft before that.
	raftSet chan struct{}

	observer *raft.Observer

	closeMu  sync.Mutex
	closed   bool
	closeErr error
}

// Open starts a node: it opens (or creates) the stores in DataDir, listens,
// starts Raft (bootstrapping a new cluster or joining an existing one when
// DataDir is empty) and returns once the node runs. A join waits until the
// leader committed this node as a voter (bounded by ctx).
func Open(ctx context.Context, cfg Config) (_ *Node, err error) {
	cfg = cfg.WithDefaults()
	if err := ValidateConfig(cfg); err != nil {
		if cfg.Listener != nil {
			cfg.Listener.Close()
		}
		return nil, err
	}
	var u undo
	defer func() {
		if err != nil {
			u.run()
		}
	}()
	if cfg.Listener != nil {
		ln := cfg.Listener
		u.add(func() { ln.Close() })
	}
	if err := prepareDataDir(cfg); err != nil {
		return nil, err
	}
	n := newNode(cfg)
	u.add(n.cancel)
	if err := n.openStorage(&u); err != nil {
		return nil, err
	}
	ln, err := n.listen(&u)
	if err != nil {
		return nil, err
	}
	if err := n.newStateMachine(&u); err != nil {
		return nil, err
	}
	n.openTransport(ln, &u)
	notify := make(chan bool, 16)
	rc := n.raftConfig(notify)
	existing, err := n.bootstrapIfNew(rc)
	if err != nil {
		return nil, err
	}
	if err := n.startRaft(rc, notify, &u); err != nil {
		return nil, err
	}
	n.wg.Add(1)
	go func() { defer n.wg.Done(); n.watchRemoval(existing) }()
	if !existing && len(cfg.Join) > 0 {
		if err := n.join(ctx); err != nil {
			return nil, err
		}
	} else if !existing && !cfg.Bootstrap {
		n.log.Warn("cluster: empty data dir and neither Bootstrap nor Join: waiting to be added by an operator")
	}
	n.log.Info("cluster: node started", "addr", n.addr, "existing_state", existing)
	return n, nil
}

// undo collects what a failed Open must release, in reverse order.
type undo []func()

func (u *undo) add(f func()) { *u = append(*u, f) }

func (u undo) run() {
	for i := len(u) - 1; i >= 0; i-- {
		u[i]()
	}
}

// prepareDataDir refuses a data dir this node was removed from
// (tombstone) and creates its snapshots directory.
func prepareDataDir(cfg Config) error {
	if err := checkTombstone(cfg.DataDir, cfg.NodeID); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(cfg.DataDir, snapshotsDir), 0o700); err != nil {
		return fmt.Errorf("cluster: create data dir %s: %w", cfg.DataDir, err)
	}
	return nil
}

func newNode(cfg Config) *Node {
	n := &Node{
		cfg:      cfg,
		log:      cfg.Logger.With("node", cfg.NodeID),
		id:       cfg.NodeID,
		leaderCh: make(chan bool, 1),
		wakeCh:   make(chan struct{}),
		fatalCh:  make(chan error, 1),

		raftStopped: make(chan struct{}),
		raftSet:     make(chan struct{}),
	}
	n.hlog = newRaftLogger(cfg.Logger, cfg.NodeID, n.stopping.Load)
	n.ctx, n.cancel = context.WithCancel(context.Background())
	return n
}

// openStorage opens raft.db (log and stable store), the snapshot store,
// the event archive and the metrics.
func (n *Node) openStorage(u *undo) (err error) {
	cfg := n.cfg
	raftPath := filepath.Join(cfg.DataDir, raftDBFile)
	n.store, err = openRaftStore(raftPath)
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return fmt.Errorf("cluster: open %s: locked: another running node uses data dir %s", raftPath, cfg.DataDir)
		}
		return fmt.Errorf("cluster: open %s: %w", raftPath, err)
	}
	u.add(func() { n.store.Close() })
	n.snaps, err = raft.NewFileSnapshotStoreWithLogger(filepath.Join(cfg.DataDir, snapshotsDir), snapshotsRetain, n.hlog.Named("snapshots"))
	if err != nil {
		return fmt.Errorf("cluster: open snapshot store: %w", err)
	}
	n.archive, err = archive.Open(filepath.Join(cfg.DataDir, archiveFile), archive.Options{
		MaxAge: cfg.Archive.MaxAge, MaxEvents: cfg.Archive.MaxEvents, Logger: n.log,
	})
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	u.add(func() { n.archive.Close() })
	n.metrics, err = newMetrics(cfg.Registerer, cfg.NodeID)
	if err != nil {
		return err
	}
	u.add(n.metrics.unregister)
	exportRaftMetrics(cfg.Registerer) // process-wide (raftmetrics.go)
	return nil
}

// listen opens the node's port (unless the config brings a listener) and
// settles the address peers dial.
func (n *Node) listen(u *undo) (net.Listener, error) {
	cfg := n.cfg
	ln := cfg.Listener
	if ln == nil {
		var err error
		ln, err = net.Listen("tcp", cfg.BindAddr)
		if err != nil {
			return nil, fmt.Errorf("cluster: listen on %s (BindAddr): %w", cfg.BindAddr, err)
		}
		u.add(func() { ln.Close() })
	}
	n.addr = cfg.AdvertiseAddr
	if n.addr == "" {
		n.addr = ln.Addr().String()
		if host, _, _ := net.SplitHostPort(n.addr); net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified() {
			return nil, &ConfigError{Key: "advertise_addr", Msg: fmt.Sprintf("required when binding %s (peers cannot dial an unspecified address)", n.addr)}
		}
	}
	return ln, nil
}

// newStateMachine builds the fsm machine and what feeds and follows it: the
// proposal batcher and forwarder, the archiver, Raft's FSM adapter.
func (n *Node) newStateMachine(u *undo) (err error) {
	n.machine = fsm.NewMachineWithOptions(fsm.Options{MaxFeatureLevel: n.cfg.FeatureLevel})
	n.batcher = newBatcher(n)
	n.forwarder = newForwarder(n)
	n.archiver, err = newArchiver(n.archive, n.onHalt)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	u.add(n.archiver.close)
	n.fsm = newRaftFSM(n.machine, n.archiver, n.id, n.log, n.metrics, n.cfg.HashHistory)
	n.fsm.onApplied = n.batcher.resolve
	n.fsm.onHalt = n.onHalt
	n.fsm.onRemoved = n.onConfigurationDropped
	n.fsm.onRestored = n.onRestored
	n.fsm.snapshotConfig = n.latestSnapshotConfig
	if cfg, idx, ok := n.latestSnapshotConfig(); ok {
		n.fsm.noteConfiguration(cfg, idx)
	}
	return nil
}

// openTransport starts the multiplexed port on ln: forwarding (client and
// server) and Raft's network transport over authenticated streams.
func (n *Node) openTransport(ln net.Listener, u *undo) {
	cfg := n.cfg
	n.net = transport.New(transport.Config{
		Listener: ln, Advertise: n.addr, TLS: cfg.TLS, Dial: cfg.Dial,
		AuthKey: cfg.AuthKey, SelfID: n.id, MemberAt: n.memberAt,
		OnAuthFailure: func(net.Addr, error) { n.metrics.authFailure() },
		Logger:        n.log,
	})
	u.add(n.net.Close)
	n.client = n.net.Client()
	n.net.Serve(n.ctx, forwardHandler{n})

	n.transport = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  n.net.StreamLayer(),
		MaxPool: 3,
		Timeout: transportTimeout,
		Logger:  n.hlog.Named("net"),
		// 1 disables pipelined replication: with it, a follower's
		// Success=false can leave the pipeline's sender and decoder blocked
		// on each other for good, wedging replication to that follower and
		// raft.Shutdown (seen here; also grafana/pyroscope#5518). Our
		// entries are already batched, where pipelining gains little.
		MaxRPCsInFlight: 1,
	})
	u.add(func() { n.transport.Close() })
}

// bootstrapIfNew writes the initial configuration when Bootstrap is set
// and the data dir holds no Raft state; existing reports whether it did.
func (n *Node) bootstrapIfNew(rc *raft.Config) (existing bool, err error) {
	cfg := n.cfg
	existing, err = raft.HasExistingState(n.store, n.store, n.snaps)
	if err != nil {
		return false, fmt.Errorf("cluster: inspect raft state in %s: %w", cfg.DataDir, err)
	}
	if err := n.checkRaftStateNotLost(filepath.Join(cfg.DataDir, raftDBFile)); err != nil {
		return false, err
	}
	if !cfg.Bootstrap {
		return existing, nil
	}
	if existing {
		n.log.Info("cluster: data dir holds raft state; Bootstrap ignored")
		return existing, nil
	}
	servers := make([]raft.Server, len(cfg.Peers))
	for i, p := range cfg.Peers {
		servers[i] = raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Addr)}
		if p.ID == n.id && p.Addr != n.addr {
			n.log.Warn("cluster: bootstrap peer address differs from this node's advertised address", "peer_addr", p.Addr, "advertised", n.addr)
		}
	}
	if err := raft.BootstrapCluster(rc, n.store, n.store, n.snaps, n.transport, raft.Configuration{Servers: servers}); err != nil {
		return false, fmt.Errorf("cluster: bootstrap: %w", err)
	}
	return existing, nil
}

// startRaft starts Raft and the node's loops: autopilot, the commit
// nudger, leadership and observation watchers, the batcher, the forwarder.
func (n *Node) startRaft(rc *raft.Config, notify chan bool, u *undo) (err error) {
	n.storeWatch = newStoreWatch(n.store, n.cfg.Registerer, n.id)
	logs, err := raft.NewLogCache(logCacheSize, snapshotTermLogs{LogStore: n.storeWatch, snaps: n.snaps})
	if err != nil {
		return fmt.Errorf("cluster: log cache: %w", err)
	}
	n.raft, err = raft.NewRaft(rc, n.fsm, logs, n.storeWatch, n.snaps, n.transport)
	close(n.raftSet)
	if err != nil {
		return fmt.Errorf("cluster: start raft: %w", err)
	}
	n.pilot.Store(newPilot(n))
	n.started.Store(true)
	u.add(func() { n.raft.Shutdown().Error() })

	obs := make(chan raft.Observation, 16)
	n.observer = raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.LeaderObservation, raft.RaftState:
			return true
		}
		return false
	})
	n.raft.RegisterObserver(n.observer)
	n.wg.Add(6)
	go func() { defer n.wg.Done(); n.pilot.Load().run(n.ctx) }()
	go func() { defer n.wg.Done(); n.batcher.runNudger(n.ctx) }()
	go func() { defer n.wg.Done(); n.watchLeadership(notify) }()
	go func() { defer n.wg.Done(); n.watchObservations(obs) }()
	go func() { defer n.wg.Done(); n.batcher.run(n.ctx) }()
	go func() { defer n.wg.Done(); n.forwarder.run(n.ctx) }()
	u.add(func() {
		n.raft.DeregisterObserver(n.observer)
		n.cancel()
		n.raft.Shutdown().Error()
		n.wg.Wait()
	})
	return nil
}

// openRaftStore opens raft.db with raft-boltdb behind boltfile's check and
// panic recovery (bbolt panics or faults on some damaged files, a truncated
// one among them, and then keeps the file mapped and locked).
func openRaftStore(path string) (*raftboltdb.BoltStore, error) {
	store, err := boltfile.Open(path, func(openFile boltfile.OpenFileFunc) (*raftboltdb.BoltStore, error) {
		return raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bolt.Options{Timeout: time.Second, OpenFile: openFile}})
	})
	if errors.Is(err, boltfile.ErrDamaged) {
		return nil, fmt.Errorf("%w; restore it from a backup, or wipe the data dir and re-join this node as a new member", err)
	}
	return store, err
}

// checkRaftStateNotLost refuses to start when raft.db holds no Raft state
// (no term, no log) while the archive or the snapshot store shows this
// node ran before: raft.db was emptied or replaced. Starting anyway would
// bootstrap a new cluster beside the old history, or rejoin having
// forgotten its term and vote (which Raft's safety relies on).
func (n *Node) checkRaftStateNotLost(raftPath string) error {
	term, err := n.store.GetUint64([]byte("CurrentTerm")) // raft's key
	if err != nil && !errors.Is(err, raftboltdb.ErrKeyNotFound) {
		return fmt.Errorf("cluster: read current term from %s: %w", raftPath, err)
	}
	last, err := n.store.LastIndex()
	if err != nil {
		return fmt.Errorf("cluster: read last log index from %s: %w", raftPath, err)
	}
	if term != 0 || last != 0 {
		return nil
	}
	var found []string
	if archived, err := n.archive.LastIndex(); err != nil {
		return fmt.Errorf("cluster: %w", err)
	} else if archived > 0 {
		found = append(found, fmt.Sprintf("%s holds entries up to index %d", n.archive.Path(), archived))
	}
	if metas, err := n.snaps.List(); err == nil && len(metas) > 0 {
		found = append(found, fmt.Sprintf("%s holds a snapshot at index %d", filepath.Join(n.cfg.DataDir, snapshotsDir), metas[0].Index))
	}
	if len(found) == 0 {
		return nil // a new node
	}
	return fmt.Errorf("cluster: %s holds no Raft state (no term, no log entries), but %s: raft.db was lost or emptied, "+
		"and starting would bootstrap a new cluster beside this history or rejoin with a forgotten vote; "+
		"to recover, wipe the data dir %s and re-join this node as a new member (remove it from the cluster, then join or add-voter), "+
		"or restore raft.db from a backup", raftPath, strings.Join(found, " and "), n.cfg.DataDir)
}

func (n *Node) raftConfig(notify chan bool) *raft.Config {
	c := raft.DefaultConfig()
	c.LocalID = raft.ServerID(n.id)
	c.HeartbeatTimeout = n.cfg.Raft.HeartbeatTimeout
	c.ElectionTimeout = n.cfg.Raft.ElectionTimeout
	c.LeaderLeaseTimeout = n.cfg.Raft.LeaderLeaseTimeout
	c.CommitTimeout = n.cfg.Raft.CommitTimeout
	c.MaxAppendEntries = n.cfg.Raft.MaxAppendEntries
	// Unbuffered: a future parked in a buffered apply channel when Raft
	// shuts down is never answered (see batcher).
	c.BatchApplyCh = false
	c.ShutdownOnRemove = true
	c.PreVoteDisabled = false
	c.NotifyCh = notify
	c.Logger = n.hlog
	c.NoLegacyTelemetry = true
	if n.cfg.SnapshotThreshold > 0 {
		c.SnapshotThreshold = n.cfg.SnapshotThreshold
	}
	if n.cfg.SnapshotInterval > 0 {
		c.SnapshotInterval = n.cfg.SnapshotInterval
	}
	if n.cfg.TrailingLogs > 0 {
		c.TrailingLogs = n.cfg.TrailingLogs
	}
	return c
}

// latestSnapshotConfig is the membership stored with the newest snapshot.
func (n *Node) latestSnapshotConfig() (raft.Configuration, uint64, bool) {
	metas, err := n.snaps.List()
	if err != nil || len(metas) == 0 {
		return raft.Configuration{}, 0, false
	}
	return metas[0].Configuration, metas[0].Index, true
}

// watchLeadership turns raft's leadership notifications into the ready
// flag: a new leader first runs a barrier, so everything committed before
// its term is applied locally before it reports ready.
func (n *Node) watchLeadership(notify <-chan bool) {
	for {
		select {
		case <-n.ctx.Done():
			return
		case leader := <-notify:
			if !leader {
				n.setReady(false)
				continue
			}
			if !n.leaderBarrier(notify) {
				return
			}
		}
	}
}

// Backoff between failed leader barriers. A barrier fails at once while a
// leadership transfer is in progress (a stopping leader hands over), so
// retrying without a pause spun: 105,032 log lines in 0.5 s.
const (
	barrierBackoffMin = 5 * time.Millisecond
	barrierBackoffMax = time.Second
)

// leaderBarrier runs the barrier of a new term until it succeeds (then the
// node reports ready), this node stops leading, or the node closes (false).
// Failures back off exponentially up to barrierBackoffMax and are logged
// once per distinct error, not once per attempt.
func (n *Node) leaderBarrier(notify <-chan bool) bool {
	backoff := barrierBackoffMin
	var lastErr string
	for n.raft.State() == raft.Leader && n.ctx.Err() == nil {
		err := waitFuture(n.ctx, n.raft.Barrier(0))
		if err == nil {
			if n.raft.State() == raft.Leader {
				n.setReady(true)
			}
			return true
		}
		if errors.Is(err, raft.ErrRaftShutdown) || n.ctx.Err() != nil {
			return false
		}
		if msg := err.Error(); msg != lastErr {
			n.log.Warn("cluster: leader barrier failed; retrying with backoff", "err", err)
			lastErr = msg
		}
		n.log.Debug("cluster: leader barrier retry", "backoff", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-n.ctx.Done():
			t.Stop()
			return false
		case leader := <-notify:
			t.Stop()
			if !leader {
				n.setReady(false)
				return true // no longer leader: nothing to get ready for
			}
		case <-t.C:
		}
		backoff = min(2*backoff, barrierBackoffMax)
	}
	return n.ctx.Err() == nil
}

func (n *Node) setReady(v bool) {
	n.readyMu.Lock()
	defer n.readyMu.Unlock()
	if n.ready.Swap(v) == v {
		return
	}
	n.metrics.setLeader(v)
	n.pilot.Load().setLeader(v)
	// Latest value wins: replace an unread value.
	select {
	case <-n.leaderCh:
	default:
	}
	select {
	case n.leaderCh <- v:
	default:
	}
	n.log.Info("cluster: leadership", "ready_leader", v)
}

func (n *Node) watchObservations(obs <-chan raft.Observation) {
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-obs:
			n.batcher.failStale()
			n.wakeMu.Lock()
			close(n.wakeCh)
			n.wakeCh = make(chan struct{})
			n.wakeMu.Unlock()
		}
	}
}

// leaderWake returns a channel closed at the next leadership or raft state
// change (proposals waiting for a leader wake on it).
func (n *Node) leaderWake() <-chan struct{} {
	n.wakeMu.Lock()
	defer n.wakeMu.Unlock()
	return n.wakeCh
}

// fatal records the error that stops this node and reports it on Fatal().
func (n *Node) fatal(err error) {
	n.fatalOnce.Do(func() {
		n.fatalErr.Store(&err)
		n.fatalCh <- err
		n.log.Error("cluster: node halted", "err", err)
	})
}

func (n *Node) fatalError() error {
	if p := n.fatalErr.Load(); p != nil {
		return *p
	}
	return nil
}

// shutdownRaftAsync stops Raft from a goroutine (callers may run on raft's
// own goroutines, which Shutdown waits for), after grace. During the grace
// Raft keeps running but the node refuses proposals: a halted leader's
// heartbeats still carry the commit index, so the followers learn that the
// halting entry committed, apply it and halt too, instead of one of them
// being left without a quorum and never learning why.
func (n *Node) shutdownRaftAsync(grace time.Duration) {
	if !n.raftStopping.CompareAndSwap(false, true) {
		return
	}
	n.setReady(false)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		<-n.raftSet
		if n.raft == nil {
			close(n.raftStopped) // NewRaft failed: nothing runs
			return
		}
		if grace > 0 {
			t := time.NewTimer(grace)
			select {
			case <-t.C:
			case <-n.ctx.Done():
			}
			t.Stop()
		}
		if err := n.raft.Shutdown().Error(); err != nil {
			n.log.Error("cluster: raft shutdown", "err", err)
		}
		n.batcher.failAll(n.stoppedError())
		close(n.raftStopped)
	}()
}

// stoppedError is what outstanding proposals get when Raft stops.
func (n *Node) stoppedError() error {
	if err := n.fatalError(); err != nil {
		return err
	}
	return ErrClosed
}

func (n *Node) onHalt(err error) {
	n.fatal(errHaltedBy(err))
	n.shutdownRaftAsync(n.cfg.Raft.HeartbeatTimeout)
}

func (n *Node) onRestored(stateIndex uint64) {
	if !n.started.Load() {
		return // startup restore of our own snapshot: the archive has those entries
	}
	if err := n.archive.NoteRestore(stateIndex, time.Now()); err != nil {
		n.log.Error("cluster: note snapshot restore in archive", "err", err)
	}
}

// memberAt is the id of the member at addr in the latest Raft
// configuration ("" when unknown, or before Raft started). It does not
// block: raft keeps the latest configuration under a lock.
func (n *Node) memberAt(addr string) string {
	if !n.started.Load() {
		return ""
	}
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return ""
	}
	for _, s := range f.Configuration().Servers {
		if string(s.Address) == addr {
			return string(s.ID)
		}
	}
	return ""
}

// ID is the node's id.
func (n *Node) ID() string { return n.id }

// Addr is the node's advertised address (Raft and forwarding).
func (n *Node) Addr() string { return n.addr }

// State is the current replicated state: a lock-free read.
func (n *Node) State() *fsm.State { return n.machine.State() }

// Archive is the node's event archive.
func (n *Node) Archive() *archive.Archive { return n.archive }

// IsLeader reports whether this node is the leader and its barrier
// completed (its state reflects everything committed before its term).
func (n *Node) IsLeader() bool { return n.ready.Load() && n.raft.State() == raft.Leader }

// LeaderChanges delivers true when this node becomes a ready leader and
// false when it stops being leader. Buffered; the latest value wins.
func (n *Node) LeaderChanges() <-chan bool { return n.leaderCh }

// Leader is the current leader as this node knows it ("" when none).
func (n *Node) Leader() (id, addr string) {
	a, i := n.raft.LeaderWithID()
	return string(i), string(a)
}

// Fatal delivers the error that halted the node (an unknown required event
// or corrupt entry, an archive failure, or removal from the cluster). It
// delivers at most one value; FatalError returns it any time after.
func (n *Node) Fatal() <-chan error { return n.fatalCh }

// FatalError is the error that halted the node, or nil.
func (n *Node) FatalError() error { return n.fatalError() }

// HashAt returns the state hash at exactly log index index — the hash of
// the state whose Index() is index — if this node applied that entry
// recently enough to remember it (the last Config.HashHistory command
// entries, and the state restored from the last snapshot). ok is false for
// an index it never applied as a command entry (a configuration entry, one
// not applied yet) or has forgotten. It does not block.
func (n *Node) HashAt(index uint64) (hash [32]byte, ok bool) {
	if index == 0 {
		return [32]byte{}, false
	}
	return n.fsm.hashes.lookup(index)
}

// WaitApplied waits until this node's state machine processed index.
func (n *Node) WaitApplied(ctx context.Context, index uint64) error {
	if n.fsm.waitApplied(index, ctx.Done(), nil) {
		return nil
	}
	return fmt.Errorf("cluster: wait for index %d (applied %d): %w", index, n.fsm.appliedIndex(), ctx.Err())
}

// WaitArchived waits until this node's archive holds index (the archive is
// written just after apply, off the proposal path).
func (n *Node) WaitArchived(ctx context.Context, index uint64) error {
	d := time.Minute
	if dl, ok := ctx.Deadline(); ok {
		d = time.Until(dl)
	}
	return n.archiver.waitArchived(index, d)
}

// Close stops the node gracefully: a leader first hands leadership to
// another voter, then Raft shuts down and the stores close. Idempotent.
func (n *Node) Close(ctx context.Context) error {
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	if !n.beginClose() {
		return n.closeErr
	}
	if n.raft.State() == raft.Leader && n.hasOtherVoters() && !n.noTransfer.Load() {
		if err := waitFuture(ctx, n.raft.LeadershipTransfer()); err != nil {
			n.log.Warn("cluster: leadership transfer on close failed", "err", err)
		}
	}
	n.closeErr = n.shutdown(false)
	return n.closeErr
}

// SkipLeadershipTransfer makes Close stop without handing leadership to
// another voter: for a deployment stopping every member, where the voter
// that would take over is stopping too and would only hand it on again.
// The node counts as stopping from now on: raft's errors about peers
// closing their connections are expected and logged at INFO.
func (n *Node) SkipLeadershipTransfer() {
	n.noTransfer.Store(true)
	n.stopping.Store(true)
}

// Kill stops the node abruptly, as if the process died: connections drop
// first, no leadership transfer. For tests.
func (n *Node) Kill() error {
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	if !n.beginClose() {
		return n.closeErr
	}
	n.closeErr = n.shutdown(true)
	return n.closeErr
}

// beginClose marks the node closed and stopping; false when it was closed
// already (then closeErr is the first close's). closeMu is held.
func (n *Node) beginClose() bool {
	if n.closed {
		return false
	}
	n.closed = true
	n.stopping.Store(true)
	return true
}

// raftHandlerGrace bounds how long closing waits for Raft's connection
// handlers before it closes the stores.
const raftHandlerGrace = 5 * time.Second

func (n *Node) shutdown(abrupt bool) error {
	n.raft.DeregisterObserver(n.observer)
	n.cancel()
	if abrupt {
		n.net.CloseConns()
	}
	var errs []error
	if n.raftStopping.CompareAndSwap(false, true) {
		if err := n.raft.Shutdown().Error(); err != nil {
			errs = append(errs, fmt.Errorf("raft shutdown: %w", err))
		}
		close(n.raftStopped)
	}
	<-n.raftStopped
	n.wg.Wait()
	n.batcher.failAll(ErrClosed)
	n.setReady(false)
	n.net.Close()
	if err := n.transport.Close(); err != nil {
		errs = append(errs, fmt.Errorf("transport: %w", err))
	}
	// A heartbeat handled while raft shut down may still write the term.
	hctx, hcancel := context.WithTimeout(context.Background(), raftHandlerGrace)
	if !n.net.WaitRaftHandlers(hctx) {
		n.log.Warn("cluster: Raft connection handlers still running at close", "waited", raftHandlerGrace)
	}
	hcancel()
	// Raft (the only producer) has stopped: flush and stop — or, for Kill,
	// drop the queue as a crash would; raft replays those entries on restart.
	if abrupt {
		n.archiver.abort()
	} else {
		n.archiver.close()
	}
	if err := n.archive.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := n.store.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close %s: %w", raftDBFile, err))
	}
	n.metrics.unregister()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cluster: close node %s: %w", n.id, err)
	}
	return nil
}

func (n *Node) hasOtherVoters() bool {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter && string(s.ID) != n.id {
			return true
		}
	}
	return false
}

// waitFuture waits for a raft future or ctx. When ctx ends first, the
// goroutine reading the future stays until raft resolves it; a future raft
// drops at shutdown (it does not drain its queues when it stops) keeps that
// goroutine forever, which test/leakcheck accounts for.
func waitFuture(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
