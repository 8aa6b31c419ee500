package telemetry

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func sampleLoad() LoadReport {
	return LoadReport{
		Instance: "ctx-0", Fleet: FleetContext, Role: "context", URL: "http://127.0.0.1:8001",
		Model: "llama-3.1-70b", Version: "dev", FeatureLevel: FeatureLevel, VerifiesHints: true,
		BootID: 0xfeedface, Seq: 7, KVSeq: 3, SentUnixMilli: 1700000000000, IntervalMilli: 100, BlockSize: 64,
		Ranks: []RankLoad{
			{Rank: 0, ActivePromptTokens: 4096, ActiveRequests: 2, QueuedRequests: 1, KVBlocksUsed: 10, KVBlocksTotal: 100, WindowLookupTokens: 1000, WindowHitTokens: 900, Overflows: 1, Evictions: 2},
			{Rank: 1, KVBlocksTotal: 100},
		},
	}
}

func TestSubjects(t *testing.T) {
	cases := []struct {
		subject string
		want    Subject
	}{
		{LoadSubject(FleetContext, "w-1"), Subject{Kind: SubjectLoad, Fleet: FleetContext, Instance: "w-1"}},
		{LoadSubject(FleetGeneration, "g_2"), Subject{Kind: SubjectLoad, Fleet: FleetGeneration, Instance: "g_2"}},
		{KVSubject("w1"), Subject{Kind: SubjectKV, Instance: "w1"}},
		{EvictSubject("w1"), Subject{Kind: SubjectEvict, Instance: "w1"}},
		{KVDumpSubject("w1"), Subject{Kind: SubjectKVDump, Instance: "w1"}},
	}
	for _, c := range cases {
		got, err := ParseSubject(c.subject)
		if err != nil || got != c.want {
			t.Errorf("ParseSubject(%q) = %+v, %v; want %+v", c.subject, got, err, c.want)
		}
	}
	if LoadSubject(FleetContext, "w1") != "tether.v1.load.context.w1" || KVSubject("w1") != "tether.v1.kv.w1" ||
		EvictSubject("w1") != "tether.v1.evict.w1" || KVDumpSubject("w1") != "tether.v1.kvdump.w1" {
		t.Error("subject spelling changed: it is a wire contract")
	}
	for _, bad := range []string{"", "tether.v2.kv.w1", "tether.v1.kv", "tether.v1.kv.w1.x", "tether.v1.kv.*",
		"tether.v1.load.w1", "tether.v1.load.prefill.w1", "tether.v1.load.context.>", "tether.v1.nope.w1", "tether.v1.kv.w 1"} {
		_, err := ParseSubject(bad)
		if !errors.Is(err, ErrBadSubject) {
			t.Errorf("ParseSubject(%q) = %v, want ErrBadSubject", bad, err)
		}
	}
	for _, id := range []string{"", "a.b", "a*", ">", "a b", strings.Repeat("x", 129), "é"} {
		if ValidInstanceID(id) == nil {
			t.Errorf("ValidInstanceID(%q) accepted", id)
		}
	}
}

func TestLoadRoundTrip(t *testing.T) {
	r := sampleLoad()
	data, err := EncodeLoad(r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeLoad(LoadSubject(FleetContext, "ctx-0"), data)
	if err != nil {
		t.Fatal(err)
	}
	r.V = Version
	if !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip\n got %+v\nwant %+v", got, r)
	}
	if hr := got.Ranks[0].HitRate(); hr != 0.9 {
		t.Errorf("HitRate = %v, want 0.9", hr)
	}
}

// mutateLoad encodes the sample as a generic JSON map, lets mut change it, and
// returns the bytes: this produces payloads EncodeLoad would refuse.
func mutateLoad(t *testing.T, mut func(m map[string]any)) []byte {
	t.Helper()
	data, err := EncodeLoad(sampleLoad())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	mut(m)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func rank0(m map[string]any) map[string]any { return m["ranks"].([]any)[0].(map[string]any) }

func TestDecodeLoadRejects(t *testing.T) {
	subj := LoadSubject(FleetContext, "ctx-0")
	cases := []struct {
		name    string
		subject string
		data    []byte
		kind    error
		field   string
	}{
		{"not json", subj, []byte("{"), ErrMalformed, ""},
		{"trailing data", subj, append(mutateLoad(t, func(map[string]any) {}), []byte(" {}")...), ErrMalformed, ""},
		{"array", subj, []byte("[1,2]"), ErrMalformed, ""},
		{"missing version", subj, mutateLoad(t, func(m map[string]any) { delete(m, "v") }), ErrUnknownVersion, "v"},
		{"future version", subj, mutateLoad(t, func(m map[string]any) { m["v"] = 2; m["ranks"] = "new shape" }), ErrUnknownVersion, "v"},
		{"string version", subj, mutateLoad(t, func(m map[string]any) { m["v"] = "1" }), ErrMalformed, ""},
		{"wrong type", subj, mutateLoad(t, func(m map[string]any) { rank0(m)["active_requests"] = "two" }), ErrMalformed, ""},
		{"fractional count", subj, mutateLoad(t, func(m map[string]any) { rank0(m)["queued_requests"] = 1.5 }), ErrMalformed, ""},
		{"negative load", subj, mutateLoad(t, func(m map[string]any) { rank0(m)["active_prompt_tokens"] = -1 }), ErrOutOfRange, "ranks[0].active_prompt_tokens"},
		{"negative prefill", subj, mutateLoad(t, func(m map[string]any) { rank0(m)["prefill_tokens"] = -5 }), ErrOutOfRange, "ranks[0].prefill_tokens"},
		{"absurd queue", subj, mutateLoad(t, func(m map[string]any) { rank0(m)["queued_requests"] = 1 << 30 }), ErrOutOfRange, "ranks[0].queued_requests"},
		{"used beyond total", subj, mutateLoad(t, func(m map[string]any) { rank0(m)["kv_blocks_used"] = 101 }), ErrOutOfRange, "ranks[0].kv_blocks_used"},
		{"hits beyond lookups", subj, mutateLoad(t, func(m map[string]any) { rank0(m)["window_hit_tokens"] = 1001 }), ErrOutOfRange, "ranks[0].window_hit_tokens"},
		{"rank out of order", subj, mutateLoad(t, func(m map[string]any) { rank0(m)["rank"] = 1 }), ErrOutOfRange, "ranks[0].rank"},
		{"no ranks", subj, mutateLoad(t, func(m map[string]any) { m["ranks"] = []any{} }), ErrOutOfRange, "ranks"},
		{"zero boot id", subj, mutateLoad(t, func(m map[string]any) { m["boot_id"] = 0 }), ErrOutOfRange, "boot_id"},
		{"zero seq", subj, mutateLoad(t, func(m map[string]any) { m["seq"] = 0 }), ErrOutOfRange, "seq"},
		{"bad url", subj, mutateLoad(t, func(m map[string]any) { m["url"] = "ftp://x" }), ErrOutOfRange, "url"},
		{"bad role", subj, mutateLoad(t, func(m map[string]any) { m["role"] = "prefill" }), ErrOutOfRange, "role"},
		{"empty model", subj, mutateLoad(t, func(m map[string]any) { m["model"] = "" }), ErrOutOfRange, "model"},
		{"zero interval", subj, mutateLoad(t, func(m map[string]any) { m["interval_ms"] = 0 }), ErrOutOfRange, "interval_ms"},
		{"instance mismatch", LoadSubject(FleetContext, "ctx-1"), mutateLoad(t, func(map[string]any) {}), ErrSubjectMismatch, "instance"},
		{"fleet mismatch", LoadSubject(FleetGeneration, "ctx-0"), mutateLoad(t, func(map[string]any) {}), ErrSubjectMismatch, "fleet"},
		{"kv subject", KVSubject("ctx-0"), mutateLoad(t, func(map[string]any) {}), ErrBadSubject, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeLoad(c.subject, c.data)
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("DecodeLoad = %v, want *DecodeError", err)
			}
			if !errors.Is(err, c.kind) || de.Field != c.field {
				t.Fatalf("DecodeLoad = %v (field %q), want %v on field %q", err, de.Field, c.kind, c.field)
			}
			if de.Reason() == "unknown" {
				t.Fatalf("no metric label for %v", err)
			}
		})
	}
}

func TestEncodeLoadRefusesInvalid(t *testing.T) {
	r := sampleLoad()
	r.Ranks[1].QueuedRequests = -3
	if _, err := EncodeLoad(r); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("EncodeLoad(negative queue) = %v, want ErrOutOfRange", err)
	}
}

func sampleEvictions() Evictions {
	return Evictions{Instance: "ctx-0", BootID: 9, Seq: 1, Evictions: []Eviction{{Rank: 1, ConversationID: "conv-a", Reason: "lru"}, {Rank: 0, ConversationID: "conv-b"}}}
}

func TestEvictionsRoundTripAndRejects(t *testing.T) {
	e := sampleEvictions()
	data, err := EncodeEvictions(e)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeEvictions(EvictSubject("ctx-0"), data)
	e.V = Version
	if err != nil || !reflect.DeepEqual(got, e) {
		t.Fatalf("round trip = %+v, %v; want %+v", got, err, e)
	}
	bad := []struct {
		name    string
		subject string
		data    string
		kind    error
	}{
		{"mismatch", EvictSubject("ctx-1"), string(data), ErrSubjectMismatch},
		{"version", EvictSubject("ctx-0"), `{"v":3}`, ErrUnknownVersion},
		{"empty list", EvictSubject("ctx-0"), `{"v":1,"instance":"ctx-0","boot_id":1,"seq":1,"evictions":[]}`, ErrOutOfRange},
		{"negative rank", EvictSubject("ctx-0"), `{"v":1,"instance":"ctx-0","boot_id":1,"seq":1,"evictions":[{"rank":-1,"conversation_id":"c"}]}`, ErrOutOfRange},
		{"empty conversation", EvictSubject("ctx-0"), `{"v":1,"instance":"ctx-0","boot_id":1,"seq":1,"evictions":[{"rank":0,"conversation_id":""}]}`, ErrOutOfRange},
		{"wrong type", EvictSubject("ctx-0"), `{"v":1,"instance":"ctx-0","boot_id":1,"seq":1,"evictions":{"rank":0}}`, ErrMalformed},
		{"load subject", LoadSubject(FleetContext, "ctx-0"), string(data), ErrBadSubject},
	}
	for _, c := range bad {
		if _, err := DecodeEvictions(c.subject, []byte(c.data)); !errors.Is(err, c.kind) {
			t.Errorf("%s: DecodeEvictions = %v, want %v", c.name, err, c.kind)
		}
	}
}

func sampleBatch() KVEventBatch {
	return KVEventBatch{Instance: "ctx-0", BootID: 42, Seq: 5, Events: []KVEvent{
		{Rank: 0, Stored: []uint64{1, 2, 3}},
		{Rank: 1, Removed: []uint64{0xffffffffffffffff}, Stored: []uint64{7}},
		{Rank: 0, Removed: []uint64{1}},
	}}
}

func TestKVEventsRoundTrip(t *testing.T) {
	b := sampleBatch()
	data, err := AppendKVEvents(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > KVEventsSize(b) {
		t.Errorf("encoded %d bytes, KVEventsSize said at most %d", len(data), KVEventsSize(b))
	}
	got, err := DecodeKVEvents(KVSubject("ctx-0"), data)
	if err != nil || !reflect.DeepEqual(got, b) {
		t.Fatalf("round trip = %+v, %v; want %+v", got, err, b)
	}
}

func TestDecodeKVEventsRejects(t *testing.T) {
	good, err := AppendKVEvents(nil, sampleBatch())
	if err != nil {
		t.Fatal(err)
	}
	patch := func(i int, v byte) []byte { c := append([]byte(nil), good...); c[i] = v; return c }
	// A header claiming 2^20 events with no bytes behind it must fail
	// before allocating for them.
	huge := append([]byte(nil), good[:4+1+5+16]...)
	huge = append(huge, 0x80, 0x80, 0x40)
	zeroHash := KVEventBatch{Instance: "ctx-0", BootID: 1, Seq: 1, Events: []KVEvent{{Rank: 0, Stored: []uint64{5}}}}
	zh, _ := AppendKVEvents(nil, zeroHash)
	for i := len(zh) - 8; i < len(zh); i++ {
		zh[i] = 0
	}
	cases := []struct {
		name    string
		subject string
		data    []byte
		kind    error
	}{
		{"empty", KVSubject("ctx-0"), nil, ErrMalformed},
		{"json", KVSubject("ctx-0"), []byte(`{"v":1}`), ErrMalformed},
		{"future version", KVSubject("ctx-0"), patch(2, 2), ErrUnknownVersion},
		{"dump type", KVSubject("ctx-0"), patch(3, kvTypeDump), ErrMalformed},
		{"truncated", KVSubject("ctx-0"), good[:len(good)-3], ErrMalformed},
		{"trailing", KVSubject("ctx-0"), append(append([]byte(nil), good...), 0), ErrMalformed},
		{"count beyond input", KVSubject("ctx-0"), huge, ErrMalformed},
		{"zero hash", KVSubject("ctx-0"), zh, ErrOutOfRange},
		{"instance mismatch", KVSubject("ctx-9"), good, ErrSubjectMismatch},
		{"evict subject", EvictSubject("ctx-0"), good, ErrBadSubject},
	}
	for _, c := range cases {
		if _, err := DecodeKVEvents(c.subject, c.data); !errors.Is(err, c.kind) {
			t.Errorf("%s: DecodeKVEvents = %v, want %v", c.name, err, c.kind)
		}
	}
}

func TestSplitKVEvents(t *testing.T) {
	events := []KVEvent{
		{Rank: 0, Stored: []uint64{1, 2, 3, 4, 5}},
		{Rank: 1, Removed: []uint64{6, 7}, Stored: []uint64{8}},
		{Rank: 2},
	}
	groups := SplitKVEvents(events, 2)
	var flatRemoved, flatStored []uint64
	for _, g := range groups {
		n := 0
		for _, ev := range g {
			n += len(ev.Removed) + len(ev.Stored)
			if ev.Rank == 1 {
				flatRemoved = append(flatRemoved, ev.Removed...)
			}
			flatStored = append(flatStored, ev.Stored...)
		}
		if n > 2 || n == 0 {
			t.Fatalf("group with %d hashes: %+v", n, g)
		}
	}
	if !reflect.DeepEqual(flatStored, []uint64{1, 2, 3, 4, 5, 8}) || !reflect.DeepEqual(flatRemoved, []uint64{6, 7}) {
		t.Fatalf("order lost: stored %v removed %v", flatStored, flatRemoved)
	}
	if len(groups) != 4 {
		t.Fatalf("%d groups, want 4: %+v", len(groups), groups)
	}
}

func TestKVDumpSplitRoundTrip(t *testing.T) {
	full := KVDump{Instance: "ctx-0", BootID: 3, Seq: 11, Ranks: []RankBlocks{{Rank: 0, Blocks: []uint64{1, 2, 3}}, {Rank: 2, Blocks: []uint64{9}}}}
	parts := SplitKVDump(full, 2)
	if len(parts) != 2 {
		t.Fatalf("%d parts, want 2", len(parts))
	}
	merged := map[int][]uint64{}
	for i, p := range parts {
		data, err := EncodeKVDump(p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeKVDump(KVDumpSubject("ctx-0"), data)
		if err != nil {
			t.Fatal(err)
		}
		if got.Part != i || got.Parts != 2 || got.Seq != 11 || got.BootID != 3 {
			t.Fatalf("part header %+v", got)
		}
		for _, rb := range got.Ranks {
			merged[rb.Rank] = append(merged[rb.Rank], rb.Blocks...)
		}
	}
	if !reflect.DeepEqual(merged, map[int][]uint64{0: {1, 2, 3}, 2: {9}}) {
		t.Fatalf("merged dump %v", merged)
	}
	empty := SplitKVDump(KVDump{Instance: "ctx-0", BootID: 3}, 10)
	if len(empty) != 1 || empty[0].Parts != 1 {
		t.Fatalf("empty dump parts %+v", empty)
	}
	data, _ := EncodeKVDump(parts[0])
	if _, err := DecodeKVDump(KVDumpSubject("other"), data); !errors.Is(err, ErrSubjectMismatch) {
		t.Fatalf("mismatch = %v", err)
	}
	if _, err := DecodeKVEvents(KVSubject("ctx-0"), data); !errors.Is(err, ErrMalformed) {
		t.Fatalf("dump decoded as events: %v", err)
	}
	if _, err := EncodeKVDump(KVDump{Instance: "ctx-0", BootID: 1, Parts: 1, Ranks: []RankBlocks{{Rank: 1}, {Rank: 0}}}); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("descending ranks = %v", err)
	}
}

func BenchmarkDecodeKVEvents(b *testing.B) {
	hs := make([]uint64, 2000)
	for i := range hs {
		hs[i] = uint64(i + 1)
	}
	data, _ := AppendKVEvents(nil, KVEventBatch{Instance: "ctx-0", BootID: 1, Seq: 1, Events: []KVEvent{{Rank: 0, Stored: hs}}})
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeKVEvents("tether.v1.kv.ctx-0", data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeLoad(b *testing.B) {
	r := sampleLoad()
	r.Ranks = make([]RankLoad, 8)
	for i := range r.Ranks {
		r.Ranks[i] = RankLoad{Rank: i, ActivePromptTokens: 1000, KVBlocksTotal: 1000, KVBlocksUsed: 500}
	}
	data, _ := EncodeLoad(r)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeLoad("tether.v1.load.context.ctx-0", data); err != nil {
			b.Fatal(err)
		}
	}
}
