package archive

import (
	"bytes"
	"testing"

	"github.com/tether-project/tether/fsm"
)

// FuzzDecodeRecord (added by the reliability suite): any stored bytes
// either decode into a record that survives encode/decode unchanged, or are
// an error; nothing panics. (Varints need not be minimal, so the bytes
// themselves may differ.)
func FuzzDecodeRecord(f *testing.F) {
	entry, err := fsm.EncodeEntry([]fsm.Proposal{{Event: fsm.Bind{Fleet: fsm.FleetContext, Key: "k", Instance: "w1"}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(encodeRecord(Record{Index: 7, Time: 1, Data: entry, Outcomes: []Outcome{{Status: fsm.StatusApplied}}}, 1))
	f.Add(encodeRecord(Record{Index: 8, Time: -5, Data: entry, Outcomes: []Outcome{{Status: fsm.StatusApplied, Reason: "r",
		Evicted: []fsm.Evicted{{Fleet: fsm.FleetContext, Key: "k", Instance: "w1", Epoch: 3, Reason: fsm.EvictTTL}}, Epoch: fsm.MakeEpoch(8, 0)}}}, 1))
	// A format-1 record (no outcome epochs).
	f.Add(append([]byte{recordVersionV1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, byte(fsm.StatusApplied), 0, 0}, entry...))
	f.Add([]byte{})
	f.Add([]byte{recordVersion, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, proposals, err := decodeRecord(42, b)
		if _, _, herr := decodeRecordHeader(b); (herr != nil) && err == nil {
			t.Fatalf("header refused what the full decoder accepted: %v", herr)
		}
		if err != nil {
			return
		}
		again := encodeRecord(r, proposals)
		r2, proposals2, err := decodeRecord(42, again)
		if err != nil || proposals2 != proposals || r2.Time != r.Time || !bytes.Equal(r2.Data, r.Data) || len(r2.Outcomes) != len(r.Outcomes) {
			t.Fatalf("encode/decode changed the record (%v):\n%+v\n%+v", err, r, r2)
		}
		for i := range r.Outcomes {
			a, c := r.Outcomes[i], r2.Outcomes[i]
			if a.Status != c.Status || a.Reason != c.Reason || a.Epoch != c.Epoch || len(a.Evicted) != len(c.Evicted) {
				t.Fatalf("outcome %d changed: %+v → %+v", i, a, c)
			}
			for j := range a.Evicted {
				if a.Evicted[j] != c.Evicted[j] {
					t.Fatalf("eviction %d/%d changed: %+v → %+v", i, j, a.Evicted[j], c.Evicted[j])
				}
			}
		}
	})
}
