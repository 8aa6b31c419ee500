package edge

import (
	"context"
	"time"

	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/fsm"
)

// leaderWatch runs the leader's duties while this node is the ready leader
// (node.LeaderChanges) and stops them when it is not.
func (e *Edge) leaderWatch() {
	defer e.wg.Done()
	var duties *leaderDuties
	defer func() { duties.stop() }()
	for {
		select {
		case <-e.ctx.Done():
			return
		case leader := <-e.node.LeaderChanges():
			if leader && duties == nil {
				duties = e.startDuties()
				e.log.Info("leader duties started")
			} else if !leader && duties != nil {
				duties.stop()
				duties = nil
				e.log.Info("leader duties stopped")
			}
		}
	}
}

// leaderDuties is one tenure's duty loop.
type leaderDuties struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (e *Edge) startDuties() *leaderDuties {
	ctx, cancel := context.WithCancel(e.ctx)
	d := &leaderDuties{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		e.leaderLoop(ctx)
	}()
	return d
}

func (d *leaderDuties) stop() {
	if d == nil {
		return
	}
	d.cancel()
	<-d.done
}

func (e *Edge) leaderLoop(ctx context.Context) {
	since := e.now()
	t := time.NewTicker(e.cfg.Leader.Interval)
	defer t.Stop()
	// Evictions queued while this node was not leader are stale.
	for len(e.evictCh) > 0 {
		<-e.evictCh
	}
	e.markTenure(ctx)
	e.leaderRound(ctx, since)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			e.leaderRound(ctx, since)
		case ev := <-e.evictCh:
			batch := []kvEviction{ev}
			for len(batch) < 512 && len(e.evictCh) > 0 {
				batch = append(batch, <-e.evictCh)
			}
			e.proposeKVEvictions(ctx, batch)
		}
	}
}

// markTenure commits an Annotation at the start of a leader's tenure.
// Raft opens a term with a no-op and the node's barrier, entries the state
// machine never sees; after this one, an idle log ends in an entry that
// every node applies, so "applied every entry it holds" (freshness) holds
// on an idle cluster as well as a busy one.
func (e *Edge) markTenure(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, max(e.cfg.Cluster.ProposeTimeout, time.Second))
	defer cancel()
	if _, err := e.propose(pctx, fsm.Annotation{Source: "edge/" + e.nodeID, Text: "leader tenure start"}); err != nil {
		e.log.Debug("leader tenure annotation not committed", "err", err)
	}
}

// leaderRound does one round of duties; each proposes at most one batch.
func (e *Edge) leaderRound(ctx context.Context, since time.Time) {
	now := e.now()
	st := e.node.State()
	var evs []fsm.Event
	kinds := map[string]int{}
	add := func(kind string, ev fsm.Event) {
		evs = append(evs, ev)
		kinds[kind]++
	}
	if st.MaxBindings() != e.cfg.MaxBindings {
		add("settings", fsm.Settings{MaxBindings: e.cfg.MaxBindings})
	}
	if lvl, ok := e.votersFeatureLevel(st); ok && lvl > st.FeatureLevel() {
		add("cluster_features", fsm.ClusterFeatures{Level: lvl})
	}
	for _, ev := range e.instanceStateChanges(st, now, now.Sub(since)) {
		add("instance_state", ev)
	}
	cutoff := now.Add(-e.cfg.SessionTTL).UnixNano()
	for _, b := range st.IdleBindings(cutoff, e.cfg.Leader.SweepBatch) {
		add("ttl_evict", fsm.Evict{Fleet: b.Fleet, Key: b.Key, Reason: fsm.EvictTTL, Epoch: b.Epoch, IdleBefore: cutoff})
	}
	if len(evs) == 0 {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, max(e.cfg.Leader.Interval, time.Second))
	defer cancel()
	start := time.Now()
	rs, err := e.node.ProposeBatch(pctx, evs)
	took := time.Since(start)
	for i, ev := range evs {
		var r fsm.Result
		if i < len(rs) {
			r = rs[i]
		}
		e.observeProposal(ev.Type(), r, err, took)
	}
	if err != nil {
		e.log.Warn("leader duties: proposal failed", "events", len(evs), "err", err)
		return
	}
	for k, n := range kinds {
		e.metrics.leaderActions.WithLabelValues(k).Add(float64(n))
	}
}

// votersFeatureLevel is the minimum advertised feature level over the
// current voters; false when a voter has not advertised yet.
func (e *Edge) votersFeatureLevel(st *fsm.State) (uint32, bool) {
	nodes := map[string]uint32{}
	for _, n := range st.Edges() {
		nodes[n.ID] = n.MaxFeatureLevel
	}
	lvl, any := uint32(0), false
	for _, p := range e.node.Status().Peers {
		if !p.Voter {
			continue
		}
		l, ok := nodes[p.ID]
		if !ok {
			return 0, false
		}
		if !any || l < lvl {
			lvl = l
		}
		any = true
	}
	return lvl, any
}

// instanceStateChanges compares what the edge sees of the workers with the
// log's records: an instance appearing or recovering is up, a draining
// one draining, one silent past telemetry.down_after down (its bindings are
// evicted on apply). tenure is how long this node has been leader: a new
// leader gives instances it has not heard from yet that long before
// declaring them down.
func (e *Edge) instanceStateChanges(st *fsm.State, now time.Time, tenure time.Duration) []fsm.Event {
	downAfter := e.cfg.Telemetry.DownAfter
	var out []fsm.Event
	seen := map[string]bool{}
	for _, in := range e.fleet.Instances(now) {
		seen[in.ID] = true
		rec, inLog := st.Instance(in.ID)
		var want fsm.InstanceStatus
		switch {
		case in.Healthy && in.Draining:
			want = fsm.InstanceDraining
		case in.Healthy:
			want = fsm.InstanceUp
		case inLog && rec.Status != fsm.InstanceDown && tenure >= downAfter &&
			(in.LastSeen.IsZero() || now.Sub(in.LastSeen) >= downAfter):
			want = fsm.InstanceDown
		default:
			continue
		}
		ev := instanceEvent(in, want)
		if inLog && rec.Status == want && rec.URL == ev.URL && rec.Version == ev.Version &&
			rec.FeatureLevel == ev.FeatureLevel && rec.Ranks == ev.Ranks && rec.Fleet == ev.Fleet {
			continue
		}
		out = append(out, ev)
	}
	if tenure >= downAfter {
		for _, rec := range st.Instances() {
			if !seen[rec.ID] && rec.Status != fsm.InstanceDown {
				out = append(out, fsm.InstanceState{Instance: rec.ID, Fleet: rec.Fleet, URL: rec.URL, Status: fsm.InstanceDown,
					Version: rec.Version, FeatureLevel: rec.FeatureLevel, Ranks: rec.Ranks})
			}
		}
	}
	return out
}

func instanceEvent(in fleetview.Instance, status fsm.InstanceStatus) fsm.InstanceState {
	return fsm.InstanceState{
		Instance: in.ID, Fleet: in.Fleet, URL: in.URL, Status: status,
		Version: in.Version, FeatureLevel: uint32(max(in.FeatureLevel, 0)), Ranks: uint32(max(in.Ranks, 0)),
	}
}

// proposeKVEvictions evicts bindings whose conversation a worker's
// scheduler dropped, conditional on the binding still being the one on that
// instance (its epoch).
func (e *Edge) proposeKVEvictions(ctx context.Context, batch []kvEviction) {
	st := e.node.State()
	var evs []fsm.Event
	for _, x := range batch {
		if !x.fleet.Valid() || x.conv == "" {
			continue
		}
		m := e.modelOfInstance(x.instance, e.now())
		if m == nil {
			continue
		}
		key := m.key(x.conv) // the conversation's key in the instance's model
		b, ok := st.Lookup(x.fleet, key)
		if !ok || b.Instance != x.instance {
			continue
		}
		evs = append(evs, fsm.Evict{Fleet: x.fleet, Key: key, Reason: fsm.EvictKVEvicted, Epoch: b.Epoch,
			Detail: "the worker's scheduler evicted the conversation"})
	}
	if len(evs) == 0 {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, max(e.cfg.Leader.Interval, time.Second))
	defer cancel()
	start := time.Now()
	rs, err := e.node.ProposeBatch(pctx, evs)
	for i, ev := range evs {
		var r fsm.Result
		if i < len(rs) {
			r = rs[i]
		}
		e.observeProposal(ev.Type(), r, err, time.Since(start))
	}
	if err == nil {
		e.metrics.leaderActions.WithLabelValues("kv_evict").Add(float64(len(evs)))
	}
}
