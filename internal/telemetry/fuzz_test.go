package telemetry

import (
	"errors"
	"reflect"
	"testing"
)

// checkDecodeErr fails unless err is nil or a *DecodeError with a known kind.
func checkDecodeErr(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	var de *DecodeError
	if !errors.As(err, &de) || de.Reason() == "unknown" {
		t.Fatalf("untyped decode error: %v", err)
	}
}

func FuzzDecodeLoad(f *testing.F) {
	good, _ := EncodeLoad(sampleLoad())
	f.Add(LoadSubject(FleetContext, "ctx-0"), good)
	f.Add(LoadSubject(FleetGeneration, "ctx-0"), good)
	f.Add("tether.v1.load.context.x", []byte(`{"v":1,"instance":"x"}`))
	f.Add("tether.v1.load.context.x", []byte(`{"v":2}`))
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		r, err := DecodeLoad(subject, data)
		checkDecodeErr(t, err)
		if err != nil {
			return
		}
		// Whatever decodes re-encodes and decodes to the same report.
		again, err := EncodeLoad(r)
		if err != nil {
			t.Fatalf("accepted report does not re-encode: %v", err)
		}
		r2, err := DecodeLoad(subject, again)
		if err != nil || !reflect.DeepEqual(r, r2) {
			t.Fatalf("re-decode mismatch: %v", err)
		}
	})
}

func FuzzDecodeEvictions(f *testing.F) {
	good, _ := EncodeEvictions(sampleEvictions())
	f.Add(EvictSubject("ctx-0"), good)
	f.Add(EvictSubject("ctx-0"), []byte(`{"v":1,"instance":"ctx-0","boot_id":1,"seq":1,"evictions":[{"rank":-1}]}`))
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		e, err := DecodeEvictions(subject, data)
		checkDecodeErr(t, err)
		if err == nil {
			if _, err := EncodeEvictions(e); err != nil {
				t.Fatalf("accepted evictions do not re-encode: %v", err)
			}
		}
	})
}

func FuzzDecodeKVEvents(f *testing.F) {
	good, _ := AppendKVEvents(nil, sampleBatch())
	f.Add(KVSubject("ctx-0"), good)
	f.Add(KVSubject("ctx-0"), good[:10])
	f.Add(KVSubject("ctx-0"), []byte("TK\x01\x01\x01a"))
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		b, err := DecodeKVEvents(subject, data)
		checkDecodeErr(t, err)
		if err != nil {
			return
		}
		again, err := AppendKVEvents(nil, b)
		if err != nil {
			t.Fatalf("accepted batch does not re-encode: %v", err)
		}
		b2, err := DecodeKVEvents(subject, again)
		if err != nil || !reflect.DeepEqual(b, b2) {
			t.Fatalf("re-decode mismatch: %v", err)
		}
	})
}

func FuzzDecodeKVDump(f *testing.F) {
	good, _ := EncodeKVDump(KVDump{Instance: "ctx-0", BootID: 3, Seq: 11, Parts: 1, Ranks: []RankBlocks{{Rank: 0, Blocks: []uint64{1, 2}}}})
	f.Add(KVDumpSubject("ctx-0"), good)
	f.Add(KVDumpSubject("ctx-0"), []byte("TK\x01\x02"))
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		d, err := DecodeKVDump(subject, data)
		checkDecodeErr(t, err)
		if err == nil {
			if _, err := EncodeKVDump(d); err != nil {
				t.Fatalf("accepted dump does not re-encode: %v", err)
			}
		}
	})
}
