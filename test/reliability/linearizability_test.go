package reliability

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
)

// A nemesis applies one kind of fault on a seeded schedule. It runs while
// the clients run and must leave faults in place only until heal; the run
// heals, restarts and converges afterwards.
type nemesis struct {
	name string
	// expect is the outcome written down for RELIABILITY.md.
	expect string
	// inject applies one fault window and returns a description of it.
	inject func(fc *faultCluster, rng *rand.Rand) string
	heal   func(fc *faultCluster)
}

func healNet(fc *faultCluster) { fc.net.Heal() }

// pick returns the leader with probability p, else a random node.
func pick(fc *faultCluster, rng *rand.Rand, p float64) int {
	if l := fc.leaderIndex(); l >= 0 && rng.Float64() < p {
		return l
	}
	return rng.Intn(len(fc.ids))
}

var nemeses = []nemesis{
	{
		name:   "partition",
		expect: "the isolated node (the leader 2/3 of the time) stops committing; a majority side elects a leader and goes on; after heal the node catches up; no acked op lost, history linearizable, hashes equal",
		inject: func(fc *faultCluster, rng *rand.Rand) string {
			i := pick(fc, rng, 0.67)
			fc.net.Isolate(fc.ids[i])
			return "isolate " + fc.ids[i]
		},
		heal: healNet,
	},
	{
		name:   "oneway",
		expect: "one direction of one or two links black-holed (e.g. leader→follower only): elections may flap; linearizable, hashes equal after heal",
		inject: func(fc *faultCluster, rng *rand.Rand) string {
			var cuts []string
			for range 1 + rng.Intn(2) {
				a := pick(fc, rng, 0.5)
				b := (a + 1 + rng.Intn(len(fc.ids)-1)) % len(fc.ids)
				fc.net.Cut(fc.ids[a], fc.ids[b])
				cuts = append(cuts, fc.ids[a]+"→"+fc.ids[b])
			}
			return "cut " + strings.Join(cuts, ",")
		},
		heal: healNet,
	},
	{
		name:   "delay",
		expect: "every link delayed 1–40 ms with jitter (some writes beyond the heartbeat): operations slow down or time out (indefinite), never wrong",
		inject: func(fc *faultCluster, rng *rand.Rand) string {
			base := time.Duration(1+rng.Intn(20)) * time.Millisecond
			jitter := time.Duration(1+rng.Intn(20)) * time.Millisecond
			fc.net.SetDelayAll(base, jitter)
			return fmt.Sprintf("delay %s+[0,%s)", base, jitter)
		},
		heal: healNet,
	},
	{
		name:   "reset",
		expect: "connections reset at random (2–20% of writes on every link): Raft and forwarding reconnect; retried proposals deduplicated by id; linearizable",
		inject: func(fc *faultCluster, rng *rand.Rand) string {
			p := 0.02 + rng.Float64()*0.18
			for _, a := range fc.ids {
				for _, b := range fc.ids {
					if a != b {
						fc.net.SetResetRate(a, b, p)
					}
				}
			}
			return fmt.Sprintf("reset p=%.2f", p)
		},
		heal: healNet,
	},
	{
		name:   "kill",
		expect: "a node (the leader 2/3 of the time) is killed (no leadership transfer, connections dropped) and restarted on the same data dir and port: it recovers from raft.db and snapshots; linearizable, hashes equal",
		inject: func(fc *faultCluster, rng *rand.Rand) string {
			i := pick(fc, rng, 0.67)
			fc.kill(i)
			return "kill " + fc.ids[i]
		},
		heal: func(fc *faultCluster) {
			for i := range fc.ids {
				if err := fc.restart(i); err != nil {
					fc.t.Error(err)
				}
			}
		},
	},
}

// runConfig sizes one run.
type runConfig struct {
	clients  int
	keys     int
	duration time.Duration // of the client phase
	windows  int           // fault windows in it
}

func defaultRunConfig() runConfig {
	return runConfig{clients: 6, keys: 4, duration: 1200 * time.Millisecond, windows: 2}
}

// runResult are a run's figures.
type runResult struct {
	ops, indefinite, bindsWon int
	epochCollisions           int
	schedule                  []string
}

// TestLinearizabilityUnderFaults runs each nemesis on many seeded
// schedules; a failure prints the seed and the schedule that replay it.
func TestLinearizabilityUnderFaults(t *testing.T) {
	base := baseSeed(t)
	runs := runsPerType()
	rc := defaultRunConfig()
	for ni, nem := range nemeses {
		t.Run(nem.name, func(t *testing.T) {
			var total runResult
			for r := range runs {
				seed := base + int64(ni)*1_000_000 + int64(r)
				res := runOnce(t, nem, seed, rc)
				if t.Failed() {
					t.Fatalf("nemesis %s failed with seed %d; replay: go test ./test/reliability -run 'TestLinearizabilityUnderFaults/%s$' -args -seed=%d -runs=1\nschedule: %s",
						nem.name, seed, nem.name, seed-int64(ni)*1_000_000, strings.Join(res.schedule, "; "))
				}
				total.ops += res.ops
				total.indefinite += res.indefinite
				total.bindsWon += res.bindsWon
				total.epochCollisions += res.epochCollisions
			}
			t.Logf("FIGURES nemesis=%s runs=%d ops=%d indefinite=%d binds_created=%d violations=0 epoch_collisions=%d",
				nem.name, runs, total.ops, total.indefinite, total.bindsWon, total.epochCollisions)
		})
	}
}

// observation is a binding a client saw: (key, epoch) → instance. For a
// given (key, epoch) there must only ever be one instance.
type observation struct {
	key      string
	epoch    uint64
	instance string
	via      string
}

func runOnce(t *testing.T, nem nemesis, seed int64, rc runConfig) runResult {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	fc := newFaultCluster(t, 3, seed, nil)
	defer fc.closeAll()
	l := fc.waitLeader(20 * time.Second)
	// Unique epochs (fsm feature level 2) are in force once
	// the cluster committed the level; an edge does this when every voter
	// advertises it.
	lctx, lcancel := context.WithTimeout(context.Background(), 20*time.Second)
	if _, err := fc.node(l).Propose(lctx, fsm.ClusterFeatures{Level: fsm.FeatureLevelMax}); err != nil {
		lcancel()
		t.Fatalf("commit feature level %d: %v", fsm.FeatureLevelMax, err)
	}
	lcancel()

	hist := newHistory()
	keys := make([]string, rc.keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("s%d-k%d", seed, i)
	}
	var (
		obsMu sync.Mutex
		obs   []observation
		seq   atomic.Int64
	)
	see := func(o observation) {
		obsMu.Lock()
		obs = append(obs, o)
		obsMu.Unlock()
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for c := range rc.clients {
		crng := rand.New(rand.NewSource(seed*31 + int64(c)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				node := fc.node(c % len(fc.ids))
				key := keys[crng.Intn(len(keys))]
				if node == nil {
					// The client's node is down: wait for its restart.
					select {
					case <-ctx.Done():
					case <-time.After(5 * time.Millisecond):
					}
					continue
				}
				roll := crng.Float64()
				switch {
				case roll < 0.45:
					inst := fmt.Sprintf("w-c%d-%d", c, seq.Add(1))
					in := opInput{kind: opBind, key: key, inst: inst}
					call := hist.now()
					out, b := doBind(node, key, inst)
					hist.add(c, in, call, out)
					if b != nil {
						see(observation{key, b.Epoch, b.Instance, "bind@" + node.ID()})
					}
				case roll < 0.80:
					in := opInput{kind: opLookup, key: key}
					call := hist.now()
					out, b, ok := doLookup(node, key)
					if ok { // a failed read has no effect: leave it out
						hist.add(c, in, call, out)
					}
					if b != nil {
						see(observation{key, b.Epoch, b.Instance, "read@" + node.ID()})
					}
				case roll < 0.90:
					// A local (possibly stale) read, as the edge does it:
					// not linearizable, but it must never show a binding
					// that was not committed.
					if b, ok := node.State().Lookup(fsm.FleetContext, key); ok {
						see(observation{key, b.Epoch, b.Instance, "local@" + node.ID()})
					}
				default:
					in := opInput{kind: opEvict, key: key}
					call := hist.now()
					hist.add(c, in, call, doEvict(node, key))
				}
			}
		}()
	}

	// The nemesis: windows of fault then heal, at seeded offsets.
	var res runResult
	slot := rc.duration / time.Duration(rc.windows)
	phaseStart := time.Now()
	for w := range rc.windows {
		start := phaseStart.Add(time.Duration(w)*slot + time.Duration(rng.Int63n(int64(slot/4))))
		hold := slot/3 + time.Duration(rng.Int63n(int64(slot/3)))
		sleepUntil(start)
		res.schedule = append(res.schedule, fmt.Sprintf("+%s %s", time.Since(phaseStart).Round(time.Millisecond), nem.inject(fc, rng)))
		sleepUntil(start.Add(hold))
		nem.heal(fc)
		res.schedule = append(res.schedule, fmt.Sprintf("+%s heal", time.Since(phaseStart).Round(time.Millisecond)))
	}
	sleepUntil(phaseStart.Add(rc.duration))
	cancel()
	wg.Wait()

	// Heal, restart, converge; then read every key through the log once
	// more so the final state is part of the checked history.
	hashes := fc.converge(30 * time.Second)
	first := ""
	for id, h := range hashes {
		if first == "" {
			first = h
		} else if h != first {
			t.Errorf("state hashes differ at equal index after heal: %v (%s)", hashes, id)
			break
		}
	}
	// The archive of every node that never installed a snapshot replays to
	// its live state.
	replayed := 0
	for i := range fc.ids {
		n := fc.node(i)
		if replayMatches(t, n.Archive(), n.State()) {
			replayed++
		}
	}
	if replayed == 0 {
		t.Log("no node has a complete archive (all restored snapshots): replay not checked")
	}
	for i, key := range keys {
		node := fc.node(i % len(fc.ids))
		in := opInput{kind: opLookup, key: key}
		call := hist.now()
		// After heal the cluster must serve again (liveness): retry the
		// read until a deadline, each attempt is still a linearizable read.
		var (
			out opOutput
			b   *fsm.Binding
			ok  bool
		)
		for deadline := time.Now().Add(20 * time.Second); !ok && time.Now().Before(deadline); {
			call = hist.now()
			out, b, ok = doLookup(node, key)
		}
		if !ok {
			t.Errorf("final read of %s on %s still failing 20s after heal", key, node.ID())
			continue
		}
		hist.add(rc.clients, in, call, out)
		if b != nil {
			see(observation{key, b.Epoch, b.Instance, "final@" + node.ID()})
		}
	}

	ops := hist.operations()
	res.ops = len(ops)
	for _, op := range ops {
		out := op.Output.(opOutput)
		if out.outcome == outIndefinite {
			res.indefinite++
		}
		if in := op.Input.(opInput); in.kind == opBind && out.outcome == outOK && out.value == in.inst {
			res.bindsWon++
		}
	}
	verdict, info := porcupine.CheckOperationsVerbose(bindingModel, ops, 20*time.Second)
	switch verdict {
	case porcupine.Ok:
	case porcupine.Unknown:
		t.Errorf("linearizability check timed out (Unknown counts as a failure): %d ops", len(ops))
	default:
		var detail strings.Builder
		for _, part := range info.PartialLinearizationsOperations() {
			if len(part) > 0 && len(part[0]) > 0 {
				key := part[0][0].Input.(opInput).key
				fmt.Fprintf(&detail, "key %s:\n%s", key, describeKey(ops, key))
			}
		}
		t.Errorf("history is NOT linearizable (%d ops):\n%s", len(ops), detail.String())
	}
	res.epochCollisions = checkOneInstancePerEpoch(t, obs, fc.node(0).Archive())
	return res
}

// checkOneInstancePerEpoch: a (key, epoch) names one placement, so every
// observation of it shows the same instance. Before unique epochs, a
// log entry that bound, evicted and bound one key again gave both
// placements the entry's index as epoch; at feature level 2 every
// placement has its own, so any collision is a failure. The message names
// the archived entry the epoch points to.
func checkOneInstancePerEpoch(t *testing.T, obs []observation, a *archive.Archive) (collisions int) {
	t.Helper()
	type ke struct {
		key   string
		epoch uint64
	}
	seen := map[ke]observation{}
	for _, o := range obs {
		k := ke{o.key, o.epoch}
		if prev, ok := seen[k]; ok && prev.instance != o.instance {
			collisions++
			t.Errorf("binding %s epoch %d (entry %d, %d Binds of the key in it) seen as %s (%s) and %s (%s)",
				o.key, o.epoch, fsm.EpochIndex(o.epoch), bindsInEntry(t, a, fsm.EpochIndex(o.epoch), o.key), prev.instance, prev.via, o.instance, o.via)
		}
		seen[k] = o
	}
	return collisions
}

// bindsInEntry counts the Bind events of key in the archived entry at index.
func bindsInEntry(t *testing.T, a *archive.Archive, index uint64, key string) int {
	t.Helper()
	waitFor(t, 10*time.Second, "the archive to reach the entry", func() bool {
		last, err := a.LastIndex()
		return err == nil && last >= index
	})
	rec, ok, err := a.Get(index)
	if err != nil || !ok {
		return 0
	}
	props, err := rec.Proposals()
	if err != nil {
		return 0
	}
	n := 0
	for _, p := range props {
		if b, isBind := p.Event.(fsm.Bind); isBind && b.Key == key {
			n++
		}
	}
	return n
}

func sleepUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d) // schedule pacing of the nemesis, not a wait for a result
	}
}

func opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 400*time.Millisecond)
}

// doBind proposes a Bind; the binding it returns (if any) is an observation.
func doBind(n *cluster.Node, key, inst string) (opOutput, *fsm.Binding) {
	ctx, cancel := opCtx()
	defer cancel()
	res, err := n.Propose(ctx, fsm.Bind{Fleet: fsm.FleetContext, Key: key, ConversationID: key, Instance: inst})
	switch {
	case err != nil:
		return opOutput{outcome: outIndefinite}, nil
	case (res.Status == fsm.StatusApplied || res.Status == fsm.StatusSuperseded) && res.Found:
		// Created, or (superseded) the binding in force, which it carries.
		return opOutput{outcome: outOK, value: res.Binding.Instance}, &res.Binding
	case res.Status == fsm.StatusDuplicate:
		// Applied once before an internal retry; the carried binding is
		// the state at the retry.
		if res.Found && res.Binding.Instance == inst {
			return opOutput{outcome: outOK, value: inst}, &res.Binding
		}
		var b *fsm.Binding
		if res.Found {
			b = &res.Binding
		}
		return opOutput{outcome: outApplied}, b
	}
	// Any other status on a well-formed bind is itself a bug; record it as
	// an impossible output so the checker reports it with its history.
	return opOutput{outcome: outOK, value: "status:" + res.Status.String() + ":" + res.Reason}, nil
}

// doLookup is a linearizable read: an Annotation through the log, then the
// node's state, which after Propose returns includes everything committed
// before the annotation.
func doLookup(n *cluster.Node, key string) (opOutput, *fsm.Binding, bool) {
	ctx, cancel := opCtx()
	defer cancel()
	if _, err := n.Propose(ctx, fsm.Annotation{Source: "reliability", Text: "read " + key}); err != nil {
		return opOutput{}, nil, false
	}
	b, ok := n.State().Lookup(fsm.FleetContext, key)
	if !ok {
		return opOutput{outcome: outOK}, nil, true
	}
	return opOutput{outcome: outOK, value: b.Instance}, &b, true
}

func doEvict(n *cluster.Node, key string) opOutput {
	ctx, cancel := opCtx()
	defer cancel()
	res, err := n.Propose(ctx, fsm.Evict{Fleet: fsm.FleetContext, Key: key, Reason: fsm.EvictAdmin, Detail: "reliability"})
	switch {
	case err != nil:
		return opOutput{outcome: outIndefinite}
	case res.Status == fsm.StatusApplied:
		return opOutput{outcome: outOK, evicted: true}
	case res.Status == fsm.StatusConditionFailed:
		return opOutput{outcome: outOK, evicted: false}
	case res.Status == fsm.StatusDuplicate:
		return opOutput{outcome: outApplied}
	}
	return opOutput{outcome: outOK, value: "status:" + res.Status.String() + ":" + res.Reason}
}
