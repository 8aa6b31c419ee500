package audit

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
)

// At feature level 2 an epoch is not its entry's index: explain reports the
// epoch the archive recorded and the rank a worker reported, and verify
// still tells a placement made before the copy from one made after it.
func TestExplainAndVerifyAtFeatureLevel2(t *testing.T) {
	lb := newLogBuilder(t)
	lb.workload(4)
	lb.entry(fsm.ClusterFeatures{Level: fsm.FeatureLevelRanks})
	parent := "parent-2"
	idx, rs := lb.entry(
		fsm.Annotation{Source: "t", Text: "pad: the bind is the second proposal"},
		fsm.Bind{Fleet: fsm.FleetContext, Key: parent, ConversationID: parent, Instance: "ctx-1", Decision: decision("edge-1", "ctx-1")},
	)
	epoch := rs[1].Binding.Epoch
	if epoch != fsm.MakeEpoch(idx, 1) {
		t.Fatalf("setup: epoch %d, want %d", epoch, fsm.MakeEpoch(idx, 1))
	}
	lb.entry(fsm.RankObserved{Fleet: fsm.FleetContext, Key: parent, Epoch: epoch, Rank: 3})
	lb.entry(fsm.RankObserved{Fleet: fsm.FleetContext, Key: parent, Epoch: epoch + 1, Rank: 5}) // names no placement
	lb.entry(fsm.Link{Child: "kid", Parent: parent, Root: parent, Depth: 1})
	lb.writeArchive(archive.Options{}, 0)
	copyState := lb.m.State()
	d := lb.open()

	ex, err := d.Explain(context.Background(), parent, ExplainOptions{Fleets: []fsm.Fleet{fsm.FleetContext}})
	if err != nil {
		t.Fatal(err)
	}
	items := ex.Histories[0].Items
	var kinds []string
	for _, it := range items {
		kinds = append(kinds, it.Kind)
	}
	if strings.Join(kinds, ",") != "bind,rank,rank" {
		t.Fatalf("items %v", kinds)
	}
	want := fmt.Sprintf("bound to ctx-1 (epoch %d)", epoch)
	if items[0].Outcome != want || items[0].Epoch != epoch {
		t.Errorf("bind: outcome %q epoch %d, want %q", items[0].Outcome, items[0].Epoch, want)
	}
	if r := items[1]; r.Rank == nil || *r.Rank != 3 || !strings.Contains(r.Outcome, "rank 3 on ctx-1") {
		t.Errorf("rank step: %+v", r)
	}
	if r := items[2]; !strings.HasPrefix(r.Outcome, "not recorded") {
		t.Errorf("rank for a stale epoch: %+v", r)
	}
	if final := fmt.Sprintf("bound to ctx-1 rank 3 (epoch %d)", epoch); ex.Histories[0].Final != final {
		t.Errorf("final %q, want %q", ex.Histories[0].Final, final)
	}
	if len(ex.Children) != 1 || ex.Children[0].Child != "kid" || !strings.Contains(ex.ChildSearch, "links index") || strings.Contains(ex.ChildSearch, "scanned") {
		t.Errorf("children %+v found by %q, want kid from the links index", ex.Children, ex.ChildSearch)
	}

	// The live node moved on: one key rebound (a level-2 epoch after the
	// copy), the rest, including the level-2 placement before the copy,
	// unchanged.
	lb.entry(fsm.Overflow{Fleet: fsm.FleetContext, Key: "conv-1", From: "ctx-2", To: "ctx-1", Reason: fsm.OverflowUnhealthy, Rebind: true})
	rep, err := Verify(context.Background(), d, stateLive{lb.m.State()}, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Mode != "bindings" || rep.ChangedSince != 1 || rep.Conflicts != 0 || rep.Equal != copyState.Len()-1 {
		t.Fatalf("moved-on edge: %d equal, %d changed since, %d conflicts (of %d): %s", rep.Equal, rep.ChangedSince, rep.Conflicts, rep.Checked, rep.Message)
	}
}

// An archive written before the links index existed: explain still finds
// the children, by reading the older records.
func TestExplainFindsChildrenInAnArchiveWithoutLinksIndex(t *testing.T) {
	lb := newLogBuilder(t)
	lb.workload(3)
	lb.entry(fsm.Bind{Fleet: fsm.FleetContext, Key: "p", ConversationID: "p", Instance: "ctx-1"})
	lb.entry(fsm.Link{Child: "c1", Parent: "p", Root: "p", Depth: 1})
	lb.entry(fsm.Link{Child: "c2", Parent: "p", Root: "p", Depth: 1})
	lb.writeArchive(archive.Options{}, 0)
	db, err := bolt.Open(filepath.Join(lb.dir, ArchiveFile), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket([]byte("links")); err != nil {
			return err
		}
		return tx.Bucket([]byte("meta")).Delete([]byte("links_from"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	ex, err := lb.open().Explain(context.Background(), "p", ExplainOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ex.Children) != 2 || ex.Children[0].Child != "c1" || ex.Children[1].Child != "c2" || !strings.Contains(ex.ChildSearch, "scanned") {
		t.Fatalf("children %+v found by %q", ex.Children, ex.ChildSearch)
	}
}
