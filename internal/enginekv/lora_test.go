package enginekv_test

import (
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/tether-project/tether/internal/enginekv"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/worker/kvevents"
)

// vLLM's blocks of a LoRA request carry lora_name (and, in newer releases,
// the name as each block's only extra key): they map to the adapter's keys,
// which is what an edge computes for a request naming the adapter. A block
// named by lora_id alone, or with other extra keys, is not keyed.
func TestLoRABlocksMapToTheAdaptersKeys(t *testing.T) {
	const bs = 4
	prompt := toks(3*bs, 7)
	raw, _ := msgpack.Marshal(map[string]any{"ts": 1.0, "events": []any{
		map[string]any{"type": "BlockStored", "block_hashes": []any{int64(1), int64(2)}, "parent_block_hash": nil,
			"token_ids": u32s(prompt[:2*bs]), "block_size": bs, "lora_id": 3, "medium": "GPU", "lora_name": "agent-a",
			"extra_keys": []any{[]any{"agent-a"}, []any{"agent-a"}}},
		map[string]any{"type": "BlockStored", "block_hashes": []any{int64(3)}, "parent_block_hash": int64(2),
			"token_ids": u32s(prompt[2*bs:]), "block_size": bs, "lora_id": 3, "medium": "GPU", "lora_name": "agent-a"},
		map[string]any{"type": "BlockStored", "block_hashes": []any{int64(9)}, "parent_block_hash": nil,
			"token_ids": u32s(prompt[:bs]), "block_size": bs, "lora_id": 4, "medium": "GPU", "lora_name": nil},
		map[string]any{"type": "BlockStored", "block_hashes": []any{int64(10)}, "parent_block_hash": nil,
			"token_ids": u32s(prompt[:bs]), "block_size": bs, "lora_id": 3, "medium": "GPU", "lora_name": "agent-a",
			"extra_keys": []any{[]any{"agent-a", "salt"}}},
	}})
	b, err := enginekv.DecodeVLLM(raw)
	if err != nil {
		t.Fatal(err)
	}
	m := enginekv.NewMapper(bs, 0)
	var stored []uint64
	for _, ev := range b.Events {
		s, _ := m.Apply(ev)
		stored = append(stored, s...)
	}
	want := prefix.AdapterBlockHashes("agent-a", prompt, bs)
	if !slices.Equal(stored, want) {
		t.Fatalf("stored %x, want the adapter's keys %x", stored, want)
	}
	if base := prefix.BlockHashes(prompt, bs); slices.Contains(stored, base[0]) {
		t.Fatal("an adapter's block took a base-model key")
	}
	if st := m.Stats(); st.Foreign != 2 {
		t.Fatalf("stats %+v: want the lora_id-only and the salted block foreign", st)
	}
	// The encoder writes what it decodes.
	enc, err := kvevents.EncodeVLLM(enginekv.Batch{DPRank: -1, Events: []enginekv.Event{{Kind: enginekv.Stored, Hashes: []enginekv.Hash{enginekv.IntHash(5)}, Tokens: prompt[:bs], BlockSize: bs, LoRAName: "agent-b"}}}, kvevents.LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := enginekv.DecodeVLLM(enc); err != nil || b.Events[0].LoRAName != "agent-b" || b.Events[0].Foreign {
		t.Fatalf("round trip: %+v %v", b, err)
	}
}

func u32s(ts []uint32) []any {
	out := make([]any, len(ts))
	for i, t := range ts {
		out[i] = int64(t)
	}
	return out
}
