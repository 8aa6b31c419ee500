package archive

import (
	"bytes"
	"context"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-project/tether/fsm"
)

func link(child, root string) fsm.Link {
	return fsm.Link{Child: child, Parent: root, Root: root, Depth: 1}
}

// Link events are indexed by their root: a parent's sub-agents are one
// prefix scan, and trimming removes the index entries with the records.
func TestLinksIndexedByRoot(t *testing.T) {
	a, _ := openTemp(t, Options{MaxEvents: 6, TrimBatch: 1})
	if from, ok, err := a.LinkIndexFrom(); err != nil || !ok || from != 1 {
		t.Fatalf("a new archive indexes links from %d (ok %v, err %v), want 1", from, ok, err)
	}
	recs := []Record{
		{Index: 1, Time: 1, Data: entry(t, bind("p", "w1"), link("c1", "p")), Outcomes: applied(2)},
		{Index: 2, Time: 2, Data: entry(t, link("c2", "p"), link("c3", "p"), link("x", "pp")), Outcomes: applied(3)},
		{Index: 3, Time: 3, Data: entry(t, link("y", "other")), Outcomes: applied(1)},
	}
	if err := a.Append(recs); err != nil {
		t.Fatal(err)
	}
	got, err := a.Links("p")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Index != 1 || got[1].Index != 2 {
		t.Fatalf("Links(p) = %v, want records 1 and 2", indexes(got))
	}
	// Length-prefixed: "p" does not match "pp".
	if got, _ := a.Links("pp"); len(got) != 1 || got[0].Index != 2 {
		t.Fatalf("Links(pp) = %v", indexes(got))
	}
	if got, _ := a.Links("nobody"); len(got) != 0 {
		t.Fatalf("Links(nobody) = %v", indexes(got))
	}
	// Links are not binding history.
	if h, _ := a.History(fsm.FleetContext, "p"); len(h) != 1 || h[0].Index != 1 {
		t.Fatalf("History(p) = %v, want only the Bind's record", indexes(h))
	}
	// 7 events > MaxEvents 6: retention drops record 1, and its index entry.
	if err := a.Append([]Record{{Index: 4, Time: 4, Data: entry(t, bind("q", "w1")), Outcomes: applied(1)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Trim(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.Links("p"); len(got) != 1 || got[0].Index != 2 {
		t.Fatalf("Links(p) after trimming record 1 = %v", indexes(got))
	}
	if err := a.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketLinks).Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			if bytes.HasSuffix(k, u64key(1)) {
				t.Errorf("index entry %q of trimmed record 1 left behind", k)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// An archive written before the links index existed: a node opening it
// indexes links from its next record on and says so; a read-only open
// reports no index at all.
func TestLinksIndexOfAnOlderArchive(t *testing.T) {
	a, path := openTemp(t, Options{})
	if err := a.Append([]Record{
		{Index: 1, Time: 1, Data: entry(t, link("c1", "p")), Outcomes: applied(1)},
		{Index: 2, Time: 2, Data: entry(t, link("c2", "p")), Outcomes: applied(1)},
	}); err != nil {
		t.Fatal(err)
	}
	// Make it look like an archive from before the index.
	if err := a.db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(bucketLinks); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Delete(metaLinksFrom)
	}); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	ro, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ro.LinkIndexFrom(); ok || err != nil {
		t.Fatalf("read-only open of an unindexed archive claims a links index (err %v)", err)
	}
	if got, err := ro.Links("p"); err != nil || len(got) != 0 {
		t.Fatalf("Links on an unindexed archive: %v %v", indexes(got), err)
	}
	ro.Close()

	rw, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	if from, ok, err := rw.LinkIndexFrom(); err != nil || !ok || from != 3 {
		t.Fatalf("reopened archive indexes links from %d (ok %v, err %v), want 3", from, ok, err)
	}
	if err := rw.Append([]Record{{Index: 3, Time: 3, Data: entry(t, link("c3", "p")), Outcomes: applied(1)}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := rw.Links("p"); len(got) != 1 || got[0].Index != 3 {
		t.Fatalf("Links(p) = %v, want only the record written after the index existed", indexes(got))
	}
}

// Outcomes keep the epoch of the binding in force after apply; records of
// format 1 (no epochs) still read.
func TestOutcomeEpochs(t *testing.T) {
	a, _ := openTemp(t, Options{})
	res := []fsm.Result{
		{Status: fsm.StatusApplied, Found: true, Created: true, Binding: fsm.Binding{Epoch: fsm.MakeEpoch(4, 0)}},
		{Status: fsm.StatusConditionFailed, Reason: "x"},
	}
	rec := Record{Index: 4, Time: 4, Data: entry(t, bind("k", "w"), fsm.Evict{Fleet: fsm.FleetContext, Key: "z", Reason: fsm.EvictAdmin}),
		Outcomes: OutcomesFromResults(res)}
	if err := a.Append([]Record{rec}); err != nil {
		t.Fatal(err)
	}
	got, ok, err := a.Get(4)
	if err != nil || !ok || got.Outcomes[0].Epoch != fsm.MakeEpoch(4, 0) || got.Outcomes[1].Epoch != 0 {
		t.Fatalf("Get(4) = %+v %v %v", got.Outcomes, ok, err)
	}
	v1 := append([]byte{recordVersionV1, 0, 0, 0, 0, 0, 0, 0, 9, 1, 1, byte(fsm.StatusApplied), 1, 'r', 0}, rec.Data...)
	old, n, err := decodeRecord(9, v1)
	if err != nil || n != 1 || len(old.Outcomes) != 1 || old.Outcomes[0].Reason != "r" || old.Outcomes[0].Epoch != 0 || !bytes.Equal(old.Data, rec.Data) {
		t.Fatalf("format-1 record: %+v %d %v", old, n, err)
	}
}
