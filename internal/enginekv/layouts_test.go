package enginekv_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/tether-project/tether/internal/enginekv"
	"github.com/tether-project/tether/test/engines/oaiserve"
)

// omap is a msgspec struct in map form: its keys in declaration order.
type omap = oaiserve.OrderedMap

// A block of 4 tokens and its successors, for the fixtures.
func tokList(base, n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = base + i
	}
	return out
}

// bigrams are the (token, next token) pairs SGLang publishes for an EAGLE
// model's page of positions base..base+n-1.
func bigrams(base, n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = []any{base + i, base + i + 1}
	}
	return out
}

// layout is one payload as an engine publishes it, and what decoding it
// must give.
type layout struct {
	name   string
	source string // the upstream file the encoding follows
	decode func([]byte) (enginekv.Batch, error)
	batch  any
	check  func(t *testing.T, b enginekv.Batch)
}

// upstreamLayouts are the KV event payloads the engines publish today and
// did before, each encoded from the upstream struct definitions (field
// order, array_like or map, omitted defaults), independently of the
// decoders.
func upstreamLayouts() []layout {
	salt := omap{{"cache_salt", "tenant-a"}}
	return []layout{
		{
			name:   "sglang-array-2025",
			source: "sglang python/sglang/srt/disaggregation/kv_events.py (2025): EventBatch(ts, events), BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id), BlockRemoved(block_hashes), array_like, omit_defaults",
			decode: enginekv.DecodeSGLang,
			batch: []any{1.5, []any{
				[]any{"BlockStored", []any{int64(-11), int64(12)}, nil, tokList(100, 8), 4, nil},
				[]any{"BlockRemoved", []any{int64(12)}},
				[]any{"AllBlocksCleared"},
			}},
			check: func(t *testing.T, b enginekv.Batch) {
				wantEvents(t, b, enginekv.Stored, enginekv.Removed, enginekv.Cleared)
				if e := b.Events[0]; e.BlockSize != 4 || len(e.Tokens) != 8 || e.HasParent || e.Foreign || e.Offloaded() || b.DPRank != -1 {
					t.Errorf("stored = %+v", e)
				}
			},
		},
		{
			name:   "sglang-attn-dp-medium",
			source: "sglang kv_events.py: EventBatch(ts, events, attn_dp_rank), BlockStored(..., lora_id, medium), BlockRemoved(block_hashes, medium); StorageMedium GPU, CPU_PINNED",
			decode: enginekv.DecodeSGLang,
			batch: []any{2.0, []any{
				[]any{"BlockStored", []any{int64(21)}, nil, tokList(200, 4), 4, nil, "GPU"},
				[]any{"BlockStored", []any{int64(22)}, int64(21), tokList(204, 4), 4, nil, "GPU"},
				[]any{"BlockStored", []any{int64(21)}, nil, tokList(200, 4), 4, nil, "CPU_PINNED"},
				[]any{"BlockRemoved", []any{int64(21)}, "CPU_PINNED"},
			}, 1},
			check: func(t *testing.T, b enginekv.Batch) {
				wantEvents(t, b, enginekv.Stored, enginekv.Stored, enginekv.Stored, enginekv.Removed)
				if b.DPRank != 1 || b.Events[0].Offloaded() || !b.Events[1].HasParent || b.Events[2].Medium != "CPU_PINNED" || b.Events[3].Medium != "CPU_PINNED" {
					t.Errorf("batch = %+v", b)
				}
			},
		},
		{
			name:   "sglang-metadata-cache-salt",
			source: "sglang kv_events.py BlockStoredWithMetadata(BlockStored, tag=\"BlockStored\", kw_only=True): metadata BlockStoredMetadata{cache_salt, session_id} after medium",
			decode: enginekv.DecodeSGLang,
			batch: []any{3.0, []any{
				[]any{"BlockStored", []any{int64(31)}, nil, tokList(300, 4), 4, nil, "GPU", salt},
				[]any{"BlockStored", []any{int64(32)}, nil, tokList(300, 4), 4, nil, "GPU"},
				[]any{"BlockStored", []any{int64(33)}, int64(32), tokList(304, 4), 4, nil, "GPU", omap{{"session_id", "conv-7"}}},
			}, 0},
			check: func(t *testing.T, b enginekv.Batch) {
				wantEvents(t, b, enginekv.Stored, enginekv.Stored, enginekv.Stored)
				if !b.Events[0].Foreign || b.Events[1].Foreign || b.Events[2].Foreign || b.Events[0].Offloaded() {
					t.Errorf("a salted block is foreign, a session id changes nothing: %+v", b.Events)
				}
			},
		},
		{
			name:   "sglang-eagle-bigram",
			source: "sglang python/sglang/srt/mem_cache/events.py record_store: bigram pages publish (token, next token) tuples",
			decode: enginekv.DecodeSGLang,
			batch: []any{4.0, []any{
				[]any{"BlockStored", []any{int64(41)}, nil, bigrams(400, 4), 4, nil, "GPU"},
			}, 0},
			check: func(t *testing.T, b enginekv.Batch) {
				wantEvents(t, b, enginekv.Stored)
				if got := b.Events[0].Tokens; !slices.Equal(got, []uint32{400, 401, 402, 403}) {
					t.Errorf("bigram tokens = %v, want the positions' tokens", got)
				}
			},
		},
		{
			name:   "sglang-component-types",
			source: "sglang mem_cache/events.py _record_store_component / _record_remove_component (--enable-kv-events-component-types): BlockStoredWithComponentType(AndMetadata), BlockRemovedWithComponentType; components full, swa, mamba",
			decode: enginekv.DecodeSGLang,
			batch: []any{5.0, []any{
				[]any{"BlockStored", []any{int64(51)}, nil, tokList(500, 4), 4, nil, "GPU", "full"},
				[]any{"BlockStored", []any{int64(52)}, int64(51), tokList(504, 4), 4, nil, "GPU", "full"},
				[]any{"BlockStored", []any{int64(52)}, nil, tokList(504, 4), 4, nil, "GPU", "swa"},
				[]any{"BlockStored", []any{int64(52)}, nil, tokList(504, 4), 4, nil, "GPU", "mamba"},
				[]any{"BlockStored", []any{int64(53)}, nil, tokList(500, 4), 4, nil, "GPU", "full", salt},
				[]any{"BlockRemoved", []any{int64(52)}, "GPU", "mamba"},
			}, 0},
			check: func(t *testing.T, b enginekv.Batch) {
				wantEvents(t, b, enginekv.Stored, enginekv.Stored, enginekv.Stored, enginekv.Stored, enginekv.Stored, enginekv.Removed)
				kinds := []string{}
				for _, e := range b.Events {
					kinds = append(kinds, fmt.Sprintf("%d/%s", e.Group, e.SpecKind))
				}
				want := []string{"0/full_attention", "0/full_attention", "1/sliding_window", "2/mamba", "0/full_attention", "2/mamba"}
				if !slices.Equal(kinds, want) || !b.Events[4].Foreign || b.Events[0].Offloaded() {
					t.Errorf("components = %v, want %v (salted: %v)", kinds, want, b.Events[4].Foreign)
				}
			},
		},
		{
			name:   "sglang-tagged-maps",
			source: "SGLang events as tagged maps (msgspec tag=True without array_like): BlockStored{block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, cache_salt, session_id}",
			decode: enginekv.DecodeSGLang,
			batch: []any{6.0, []any{
				omap{{"type", "BlockStored"}, {"block_hashes", []any{int64(61)}}, {"parent_block_hash", nil}, {"token_ids", tokList(600, 4)}, {"block_size", 4}, {"lora_id", nil}, {"medium", "GPU"}, {"session_id", "conv-1"}},
				omap{{"type", "BlockStored"}, {"block_hashes", []any{int64(62)}}, {"parent_block_hash", nil}, {"token_ids", tokList(600, 4)}, {"block_size", 4}, {"lora_id", nil}, {"medium", "GPU"}, {"cache_salt", "tenant-b"}},
				omap{{"type", "BlockRemoved"}, {"block_hashes", []any{int64(61)}}, {"medium", "GPU"}},
			}, 0},
			check: func(t *testing.T, b enginekv.Batch) {
				wantEvents(t, b, enginekv.Stored, enginekv.Stored, enginekv.Removed)
				if b.Events[0].Foreign || !b.Events[1].Foreign {
					t.Errorf("salt in a map event: %+v", b.Events)
				}
			},
		},
		{
			name:   "sglang-snapshot-barrier",
			source: "sglang kv_events.py _service_snapshot_capture: an empty KVEventBatch(ts, [], attn_dp_rank) on the live stream",
			decode: enginekv.DecodeSGLang,
			batch:  []any{7.0, []any{}, 3},
			check: func(t *testing.T, b enginekv.Batch) {
				wantEvents(t, b)
				if b.DPRank != 3 {
					t.Errorf("rank = %d", b.DPRank)
				}
			},
		},
		{
			name:   "vllm-array-2025",
			source: "vllm/distributed/kv_events.py (mid-2025): array_like BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name), omit_defaults",
			decode: enginekv.DecodeVLLM,
			batch: []any{8.0, []any{
				[]any{"BlockStored", []any{int64(81)}, nil, tokList(800, 4), 4, nil},
				[]any{"BlockStored", []any{int64(82)}, int64(81), tokList(804, 4), 4, 1, "GPU", "sql-lora"},
				[]any{"BlockRemoved", []any{int64(81)}, "GPU"},
			}, 0},
			check: func(t *testing.T, b enginekv.Batch) {
				wantEvents(t, b, enginekv.Stored, enginekv.Stored, enginekv.Removed)
				if b.Events[1].LoRAName != "sql-lora" || b.Events[1].Foreign {
					t.Errorf("lora = %+v", b.Events[1])
				}
			},
		},
		{
			name:   "vllm-map-hybrid",
			source: "vllm/distributed/kv_events.py today: maps (tag=True, omit_defaults), ExternalBlockHash bytes, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window",
			decode: enginekv.DecodeVLLM,
			batch: omap{{"ts", 9.0}, {"events", []any{
				omap{{"type", "BlockStored"}, {"block_hashes", []any{[]byte("h91")}}, {"parent_block_hash", nil}, {"token_ids", tokList(900, 4)}, {"block_size", 4}, {"lora_id", nil}, {"medium", "GPU"}, {"lora_name", nil}, {"group_idx", 0}, {"kv_cache_spec_kind", "full_attention"}},
				omap{{"type", "BlockStored"}, {"block_hashes", []any{[]byte("h91")}}, {"parent_block_hash", nil}, {"token_ids", tokList(900, 4)}, {"block_size", 4}, {"lora_id", nil}, {"medium", "GPU"}, {"lora_name", nil}, {"group_idx", 1}, {"kv_cache_spec_kind", "sliding_window"}, {"kv_cache_spec_sliding_window", 128}},
				omap{{"type", "BlockRemoved"}, {"block_hashes", []any{[]byte("h91")}}, {"medium", "GPU"}, {"group_idx", 1}},
				omap{{"type", "AllBlocksCleared"}},
			}}, {"data_parallel_rank", 0}},
			check: func(t *testing.T, b enginekv.Batch) {
				wantEvents(t, b, enginekv.Stored, enginekv.Stored, enginekv.Removed, enginekv.Cleared)
				if b.Events[1].Group != 1 || b.Events[1].SpecKind != "sliding_window" || b.Events[1].SlidingWindow != 128 || b.Events[2].Group != 1 {
					t.Errorf("groups = %+v", b.Events)
				}
			},
		},
		{
			name:   "vllm-map-locality",
			source: "vllm/distributed/kv_events.py v0.29: BlockStored and BlockRemoved gain locality and ownership",
			decode: enginekv.DecodeVLLM,
			batch: omap{{"ts", 10.0}, {"events", []any{
				omap{{"type", "BlockStored"}, {"block_hashes", []any{int64(101)}}, {"parent_block_hash", nil}, {"token_ids", tokList(1000, 4)}, {"block_size", 4}, {"lora_id", nil}, {"medium", "GPU"}, {"lora_name", nil}, {"locality", "LOCAL"}, {"ownership", "PRIMARY"}},
				omap{{"type", "BlockRemoved"}, {"block_hashes", []any{int64(101)}}, {"medium", "GPU"}, {"locality", "LOCAL"}},
			}}},
			check: func(t *testing.T, b enginekv.Batch) { wantEvents(t, b, enginekv.Stored, enginekv.Removed) },
		},
		{
			name:   "vllm-offloading",
			source: "vllm offloading_connector.py take_events: BlockStored(block_hashes, parent_block_hash=None, token_ids=[], block_size=0, medium, lora_name=None)",
			decode: enginekv.DecodeVLLM,
			batch: omap{{"ts", 11.0}, {"events", []any{
				omap{{"type", "BlockStored"}, {"block_hashes", []any{[]byte("h91")}}, {"parent_block_hash", nil}, {"token_ids", []any{}}, {"block_size", 0}, {"lora_id", nil}, {"medium", "CPU"}, {"lora_name", nil}},
				omap{{"type", "BlockRemoved"}, {"block_hashes", []any{[]byte("h91")}}, {"medium", "CPU"}},
			}}},
			check: func(t *testing.T, b enginekv.Batch) {
				wantEvents(t, b, enginekv.Stored, enginekv.Removed)
				if b.Events[0].Medium != "CPU" || b.Events[0].BlockSize != 0 {
					t.Errorf("offloaded = %+v", b.Events[0])
				}
			},
		},
	}
}

func wantEvents(t *testing.T, b enginekv.Batch, kinds ...enginekv.Kind) {
	t.Helper()
	if len(b.Skipped) != 0 {
		t.Fatalf("skipped %+v", b.Skipped)
	}
	var got []enginekv.Kind
	for _, e := range b.Events {
		got = append(got, e.Kind)
	}
	if !slices.Equal(got, kinds) {
		t.Fatalf("events %v, want %v", got, kinds)
	}
}

func (l layout) payload(t testing.TB) []byte {
	data, err := msgpack.Marshal(l.batch)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestUpstreamLayouts decodes every layout the engines publish.
func TestUpstreamLayouts(t *testing.T) {
	for _, l := range upstreamLayouts() {
		t.Run(l.name, func(t *testing.T) {
			b, err := l.decode(l.payload(t))
			if err != nil {
				t.Fatalf("%s: %v", l.source, err)
			}
			l.check(t, b)
		})
	}
}

// TestFuzzSeedsCommitted checks that each layout is a committed seed of the
// fuzz targets (testdata/fuzz/<target>/<layout>); TETHER_UPDATE_SEEDS=1
// writes them.
func TestFuzzSeedsCommitted(t *testing.T) {
	for _, l := range upstreamLayouts() {
		target := "FuzzDecodeVLLM"
		if l.name[:6] == "sglang" {
			target = "FuzzDecodeSGLang"
		}
		path := filepath.Join("testdata", "fuzz", target, l.name)
		want := []byte("go test fuzz v1\n[]byte(" + strconv.Quote(string(l.payload(t))) + ")\n")
		if os.Getenv("TETHER_UPDATE_SEEDS") == "1" {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: the seed is missing or stale (TETHER_UPDATE_SEEDS=1 go test -run TestFuzzSeedsCommitted writes it): %v", path, err)
		}
	}
}

func FuzzDecodeVLLM(f *testing.F)   { fuzzDecoder(f, enginekv.DecodeVLLM) }
func FuzzDecodeSGLang(f *testing.F) { fuzzDecoder(f, enginekv.DecodeSGLang) }

// fuzzDecoder checks a decoder never panics, and that what it returns is
// something the Mapper can apply: known kinds, token counts within bounds,
// each skipped event with a reason.
func fuzzDecoder(f *testing.F, decode func([]byte) (enginekv.Batch, error)) {
	for _, l := range upstreamLayouts() {
		f.Add(l.payload(f))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := decode(data)
		if err != nil {
			return
		}
		for _, e := range b.Events {
			switch e.Kind {
			case enginekv.Stored:
				if e.BlockSize < 0 || (e.BlockSize == 0 && len(e.Tokens) != 0) {
					t.Fatalf("stored event with block size %d and %d tokens", e.BlockSize, len(e.Tokens))
				}
			case enginekv.Removed, enginekv.Cleared:
			default:
				t.Fatalf("event of kind %v", e.Kind)
			}
		}
		for _, s := range b.Skipped {
			switch s.Reason {
			case enginekv.SkipUnknownEvent, enginekv.SkipMalformedEvent:
			default:
				t.Fatalf("skip reason %q", s.Reason)
			}
		}
		m := enginekv.NewMapper(4, 1<<10)
		for _, e := range b.Events {
			m.ApplyTiers(e)
		}
	})
}
