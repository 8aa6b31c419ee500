package fsm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// fuzzEntrySeeds are encoded log entries covering every event type, an
// unknown optional and an unknown required event.
func fuzzEntrySeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	var all []Proposal
	for i, tc := range codecCases() {
		if len(tc.name) > 0 && (tc.name == "bind max fields") {
			continue // 400 KB: too large to be a useful seed
		}
		p := Proposal{ID: ProposalID{byte(i + 1)}, Event: tc.ev}
		all = append(all, p)
		data, err := EncodeEntry([]Proposal{p})
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, data)
	}
	data, err := EncodeEntry(all)
	if err != nil {
		t.Fatal(err)
	}
	seeds = append(seeds, data, appendUnknownOptional(seeds[0]), []byte{entryVersion, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0x0c, 1})
	return seeds
}

// fuzzSnapshotSeeds are snapshots of small states built from random logs.
func fuzzSnapshotSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	for _, n := range []int{0, 5, 40} {
		m := NewMachine()
		for _, e := range randomLog(uint64(n)+100, n) {
			if _, err := m.Apply(e); err != nil {
				t.Fatal(err)
			}
		}
		var buf bytes.Buffer
		if err := m.State().WriteSnapshot(&buf); err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, buf.Bytes())
	}
	return seeds
}

// FuzzDecodeEntry: decoding never panics; what decodes re-encodes to the
// same events, and applying it never panics either.
func FuzzDecodeEntry(f *testing.F) {
	for _, s := range fuzzEntrySeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		props, err := DecodeEntry(data)
		if err != nil {
			return
		}
		for i, p := range props {
			if p.Event == nil {
				continue
			}
			enc, err := EncodeEvent(p.Event)
			if err != nil {
				t.Fatalf("proposal %d decoded but does not re-encode: %v", i, err)
			}
			again, err := DecodeEvent(enc)
			if err != nil {
				t.Fatalf("proposal %d re-encoding does not decode: %v", i, err)
			}
			if fmt.Sprintf("%#v", normalizeEvent(again)) != fmt.Sprintf("%#v", normalizeEvent(p.Event)) {
				t.Fatalf("proposal %d round trip changed the event", i)
			}
		}
		m := NewMachine()
		if _, err := m.Apply(Entry{Index: 1, Time: 1, Data: data}); err != nil && m.Halted() == nil {
			t.Fatalf("apply failed without halting: %v", err)
		}
	})
}

// FuzzReadSnapshot: reading any byte stream never panics; what reads back
// writes back to a snapshot that reads to the same hash.
func FuzzReadSnapshot(f *testing.F) {
	for _, s := range fuzzSnapshotSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ReadSnapshot(bytes.NewReader(data))
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if err := s.WriteSnapshot(&buf); err != nil {
			t.Fatal(err)
		}
		again, err := ReadSnapshot(&buf)
		if err != nil || again.Hash() != s.Hash() {
			t.Fatalf("re-read: %v", err)
		}
	})
}

// FuzzSnapshotRecords fuzzes the record decoder behind the checksums: the
// input becomes the body of one correctly checksummed chunk.
func FuzzSnapshotRecords(f *testing.F) {
	for _, s := range fuzzSnapshotSeeds(f) {
		if body, ok := singleChunkBody(s); ok {
			f.Add(body)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) == 0 {
			return
		}
		_, _ = ReadSnapshot(bytes.NewReader(frameSnapshotBody(body)))
	})
}

func frameSnapshotBody(body []byte) []byte { return frameSnapshotBodyVersion(body, snapshotVersion) }

func frameSnapshotBodyVersion(body []byte, version byte) []byte {
	out := append([]byte(snapshotMagic), version)
	out = binary.AppendUvarint(out, uint64(len(body)))
	out = append(out, body...)
	out = binary.LittleEndian.AppendUint32(out, crc32.Checksum(body, crcTable))
	return append(out, 0)
}

func singleChunkBody(snap []byte) ([]byte, bool) {
	rest := snap[len(snapshotMagic)+1:]
	n, k := binary.Uvarint(rest)
	if k <= 0 || uint64(len(rest)) != uint64(k)+n+4+1 {
		return nil, false
	}
	return rest[k : k+int(n)], true
}

func TestFrameSnapshotBody(t *testing.T) {
	for _, s := range fuzzSnapshotSeeds(t) {
		body, ok := singleChunkBody(s)
		if !ok {
			t.Fatal("seed snapshot is not a single chunk")
		}
		if !bytes.Equal(frameSnapshotBodyVersion(body, s[len(snapshotMagic)]), s) {
			t.Fatal("re-framing a snapshot body does not reproduce it")
		}
	}
}

// TestWriteFuzzSeedCorpus regenerates testdata/fuzz when
// FSM_WRITE_FUZZ_SEEDS=1 (after a format change); otherwise it checks that
// the committed corpus exists.
func TestWriteFuzzSeedCorpus(t *testing.T) {
	sets := map[string][][]byte{
		"FuzzDecodeEntry":  fuzzEntrySeeds(t),
		"FuzzReadSnapshot": fuzzSnapshotSeeds(t),
	}
	for _, s := range sets["FuzzReadSnapshot"] {
		if body, ok := singleChunkBody(s); ok {
			sets["FuzzSnapshotRecords"] = append(sets["FuzzSnapshotRecords"], body)
		}
	}
	for name, seeds := range sets {
		dir := filepath.Join("testdata", "fuzz", name)
		if os.Getenv("FSM_WRITE_FUZZ_SEEDS") != "1" {
			entries, err := os.ReadDir(dir)
			if err != nil || len(entries) == 0 {
				t.Fatalf("no committed seed corpus in %s (run with FSM_WRITE_FUZZ_SEEDS=1): %v", dir, err)
			}
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seeds {
			content := "go test fuzz v1\n[]byte(" + strconv.Quote(string(s)) + ")\n"
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
