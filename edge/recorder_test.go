package edge

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/edge/proposals"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/test/natstest"
)

// TestRecorderRetriesApplyEachEventOnce times out the recorder's proposals
// on purpose (deadlines from 1 ms up, doubling per failed attempt) on a
// follower of a real 3-node cluster, so batches commit after their deadline
// and are proposed again. Every queued event must be applied exactly once:
// counted in the archive, a repeat must be the fsm's duplicate. Before the
// recorder kept its proposal ids across attempts, each retry drew new ids
// and a late commit plus its retry applied the same Overflow twice.
func TestRecorderRetriesApplyEachEventOnce(t *testing.T) {
	ns := natstest.Start(t, nil)
	ec := startEdges(t, 3, ns.ClientURL(), nil)
	lead := ec.leader(15 * time.Second)
	fol := ec.edge((lead + 1) % 3).e
	// A recorder of its own over the follower's node and metrics.
	r := proposals.New(context.Background(), proposalsEdge{fol}, proposals.Config{NodeID: fol.nodeID,
		ProposeTimeout: fol.cfg.Cluster.ProposeTimeout, TouchInterval: fol.cfg.TouchInterval, Metrics: fol.metrics, Logger: fol.log, Now: fol.now}).Recorder

	const events = 3000
	for i := range events {
		r.Add(fsm.Overflow{Fleet: fsm.FleetContext, Key: fmt.Sprintf("d2-%d", i), From: "w-a", To: "w-b",
			Reason: fsm.OverflowSaturated, Decision: fsm.Decision{Edge: fol.nodeID, RequestID: fmt.Sprintf("r-%d", i)}}, nil)
	}
	failures, timeout := 0, time.Millisecond
	deadline := time.Now().Add(60 * time.Second)
	for r.Queued() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("recorder still holds %d events after 60 s (%d failed attempts)", r.Queued(), failures)
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		ok := r.Flush(ctx)
		cancel()
		if ok {
			timeout = time.Millisecond
			continue
		}
		failures++
		timeout = min(2*timeout, 2*time.Second)
	}
	if failures == 0 {
		t.Fatal("no flush timed out: the test did not exercise a retry")
	}
	if d := counter(t, ec.edge((lead+1)%3).registry, "tether_edge_recorder_dropped_total", nil); d != 0 {
		t.Fatalf("%v events dropped; the test needs every event proposed until it committed", d)
	}

	// A marker through the leader's queue after everything the follower sent.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	leader := ec.edge(lead).e
	if _, err := leader.Node().Propose(ctx, fsm.Annotation{Source: "test", Text: "marker"}); err != nil {
		t.Fatal(err)
	}
	last := leader.Node().State().Index()
	if err := fol.Node().WaitApplied(ctx, last); err != nil {
		t.Fatal(err)
	}
	if err := fol.Node().WaitArchived(ctx, last); err != nil {
		t.Fatal(err)
	}
	applied := map[string]int{}
	duplicates := 0
	errStop := errors.New("stop")
	err := fol.Node().Archive().Range(1, last, func(rec archive.Record) error {
		props, err := fsm.DecodeEntry(rec.Data)
		if err != nil {
			return fmt.Errorf("entry %d: %w", rec.Index, err)
		}
		for i, p := range props {
			ov, ok := p.Event.(fsm.Overflow)
			if !ok || i >= len(rec.Outcomes) {
				continue
			}
			if rec.Outcomes[i].Status == fsm.StatusDuplicate {
				duplicates++
				continue
			}
			applied[ov.Key]++
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		t.Fatal(err)
	}
	bad := 0
	for i := range events {
		k := fmt.Sprintf("d2-%d", i)
		if n := applied[k]; n != 1 {
			if bad < 5 {
				t.Errorf("overflow %s applied %d times", k, n)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d events not applied exactly once (%d failed flushes)", bad, events, failures)
	}
	t.Logf("%d events, %d failed flushes, %d retries answered as duplicates, each applied once", events, failures, duplicates)
}
