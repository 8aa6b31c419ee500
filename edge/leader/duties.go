package leader

import (
	"context"
	"time"

	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/fsm"
)

// round does one round of duties; each proposes at most one batch.
func (d *Duties) round(ctx context.Context, since time.Time) {
	now := d.edge.Now()
	st := d.edge.Node().State()
	var evs []fsm.Event
	kinds := map[string]int{}
	add := func(kind string, ev fsm.Event) {
		evs = append(evs, ev)
		kinds[kind]++
	}
	if st.MaxBindings() != d.cfg.MaxBindings {
		add("settings", fsm.Settings{MaxBindings: d.cfg.MaxBindings})
	}
	if lvl, ok := d.votersFeatureLevel(st); ok && lvl > st.FeatureLevel() {
		add("cluster_features", fsm.ClusterFeatures{Level: lvl})
	}
	for _, ev := range d.instanceStateChanges(st, now, now.Sub(since)) {
		add("instance_state", ev)
	}
	cutoff := now.Add(-d.cfg.SessionTTL).UnixNano()
	for _, b := range st.IdleBindings(cutoff, d.cfg.SweepBatch) {
		add("ttl_evict", fsm.Evict{Fleet: b.Fleet, Key: b.Key, Reason: fsm.EvictTTL, Epoch: b.Epoch, IdleBefore: cutoff})
	}
	if len(evs) == 0 {
		return
	}
	if err := d.proposeBatch(ctx, evs); err != nil {
		d.log.Warn("leader duties: proposal failed", "events", len(evs), "err", err)
		return
	}
	for k, n := range kinds {
		d.cfg.Acted(k, n)
	}
}

// proposeBatch proposes evs as one batch and records each event's result.
func (d *Duties) proposeBatch(ctx context.Context, evs []fsm.Event) error {
	pctx, cancel := context.WithTimeout(ctx, max(d.cfg.Interval, time.Second))
	defer cancel()
	start := time.Now()
	rs, err := d.edge.Node().ProposeBatch(pctx, evs)
	took := time.Since(start)
	for i, ev := range evs {
		var r fsm.Result
		if i < len(rs) {
			r = rs[i]
		}
		d.edge.ObserveProposal(ev.Type(), r, err, took)
	}
	return err
}

// votersFeatureLevel is the minimum advertised feature level over the
// current voters; false when a voter has not advertised yet.
func (d *Duties) votersFeatureLevel(st *fsm.State) (uint32, bool) {
	nodes := map[string]uint32{}
	for _, n := range st.Edges() {
		nodes[n.ID] = n.MaxFeatureLevel
	}
	lvl, any := uint32(0), false
	for _, p := range d.edge.Node().Status().Peers {
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
// one draining, one silent past DownAfter down (its bindings are evicted
// on apply). tenure is how long this node has been leader: a new leader
// gives instances it has not heard from yet that long before declaring
// them down.
//
// A silence every instance the view knows shares (none heard within
// DownAfter) is this edge's — its telemetry link, or the process itself
// stalled on a starved host — not evidence against any one of them: it
// declares none of them down.
func (d *Duties) instanceStateChanges(st *fsm.State, now time.Time, tenure time.Duration) []fsm.Event {
	downAfter := d.cfg.DownAfter
	var out []fsm.Event
	seen := map[string]bool{}
	instances := d.edge.Fleet().Instances(now)
	heardAny := false
	for _, in := range instances {
		if !in.LastSeen.IsZero() && now.Sub(in.LastSeen) < downAfter {
			heardAny = true
		}
	}
	for _, in := range instances {
		seen[in.ID] = true
		rec, inLog := st.Instance(in.ID)
		var want fsm.InstanceStatus
		switch {
		case in.Healthy && in.Draining:
			want = fsm.InstanceDraining
		case in.Healthy:
			want = fsm.InstanceUp
		case inLog && rec.Status != fsm.InstanceDown && tenure >= downAfter && heardAny &&
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
func (d *Duties) proposeKVEvictions(ctx context.Context, batch []eviction) {
	st := d.edge.Node().State()
	var evs []fsm.Event
	for _, x := range batch {
		if !x.fleet.Valid() || x.conv == "" {
			continue
		}
		key, ok := d.edge.ConversationKey(x.instance, x.conv)
		if !ok {
			continue
		}
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
	if d.proposeBatch(ctx, evs) == nil {
		d.cfg.Acted("kv_evict", len(evs))
	}
}
