package audit

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
)

// A conversation that left a drained instance: explain shows the rebind
// with reason drained, says in words that an operator drained the
// instance, and prints the evidence naming the drained instance it left.
func TestExplainDrainedMove(t *testing.T) {
	lb := newLogBuilder(t)
	lb.workload(2) // conv-0 on ctx-1, conv-1 on ctx-2
	lb.entry(fsm.ClusterFeatures{Level: fsm.FeatureLevelDrain})
	lb.entry(fsm.InstanceDrain{Instance: "ctx-1", Drain: true, Source: "admin via edge-1"})
	dec := decision("edge-2", "ctx-2")
	dec.RequestID = "req-drained"
	lb.entry(fsm.Overflow{Fleet: fsm.FleetContext, Key: "conv-0", From: "ctx-1", To: "ctx-2", Reason: fsm.OverflowDrained, Rebind: true, Decision: dec})
	lb.entry(fsm.Evidence{Fleet: fsm.FleetContext, Key: "conv-0", RequestID: "req-drained", Rule: "overflow:drained", Candidates: []fsm.EvidenceCandidate{
		{Instance: "ctx-2", CachedBlocks: 0, LoadTokens: 10, Flags: fsm.EvidenceChosen},
		{Instance: "ctx-1", CachedBlocks: 12, Flags: fsm.EvidenceBound | fsm.EvidenceDraining},
	}})
	lb.writeArchive(archive.Options{}, 0)
	d := lb.open()

	ex, err := d.Explain(context.Background(), "conv-0", ExplainOptions{Fleets: []fsm.Fleet{fsm.FleetContext}})
	if err != nil {
		t.Fatal(err)
	}
	var moved *Item
	for i := range ex.Histories[0].Items {
		if it := &ex.Histories[0].Items[i]; it.Kind == "overflow" {
			moved = it
		}
	}
	if moved == nil || moved.Reason != "drained" || !moved.Rebind || moved.From != "ctx-1" || moved.To != "ctx-2" ||
		!strings.Contains(moved.Outcome, "an operator drained ctx-1") || moved.Evidence == nil || moved.Evidence.Rule != "overflow:drained" {
		t.Fatalf("the drained move: %+v", moved)
	}
	if !strings.HasPrefix(ex.Histories[0].Final, "bound to ctx-2") {
		t.Fatalf("final %q", ex.Histories[0].Final)
	}
	var text bytes.Buffer
	if err := ex.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"overflow ctx-1 -> ctx-2 (drained, rebind=true)", "an operator drained ctx-1", "evidence: rule overflow:drained;", "ctx-1 cached_blocks=12", "[bound,draining]"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("explain text lacks %q:\n%s", want, text.String())
		}
	}
}
