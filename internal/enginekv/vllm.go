package enginekv

import (
	"bytes"
	"errors"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
)

// MaxPayloadBytes bounds one engine message; larger ones are rejected
// before decoding (a forged length cannot make the worker allocate more).
const MaxPayloadBytes = 64 << 20

// maxBlocksPerEvent and maxTokensPerEvent bound one event's lists.
const (
	maxBlocksPerEvent = 1 << 20
	maxTokensPerEvent = 1 << 26
	maxGroups         = 1 << 10 // KV cache groups of one model
)

// DecodeVLLM decodes one msgpack KVEventBatch as published by vLLM's and
// SGLang's ZmqEventPublisher. Both msgspec layouts are accepted: array_like
// structs (SGLang, vLLM up to mid-2025: [ts, events, dp_rank?], each event
// [tag, field...]) and maps (current vLLM: {"ts":…, "events":…,
// "data_parallel_rank":…}, each event {"type": tag, field: …}). Field order
// for the array layout follows vllm/distributed/kv_events.py (see DESIGN.md).
func DecodeVLLM(payload []byte) (Batch, error) {
	if len(payload) > MaxPayloadBytes {
		return Batch{}, fmt.Errorf("enginekv: payload of %d bytes (max %d)", len(payload), MaxPayloadBytes)
	}
	dec := msgpack.NewDecoder(bytes.NewReader(payload))
	v, err := dec.DecodeInterfaceLoose()
	if err != nil {
		return Batch{}, fmt.Errorf("enginekv: msgpack: %w", err)
	}
	b := Batch{DPRank: -1}
	var events []any
	switch t := v.(type) {
	case []any:
		if len(t) < 2 {
			return Batch{}, fmt.Errorf("enginekv: batch array of %d fields (want ts, events[, data_parallel_rank])", len(t))
		}
		if b.TS, err = asFloat(t[0]); err != nil {
			return Batch{}, fmt.Errorf("enginekv: batch ts: %w", err)
		}
		if events, err = asList(t[1]); err != nil {
			return Batch{}, fmt.Errorf("enginekv: batch events: %w", err)
		}
		if len(t) > 2 && t[2] != nil {
			if b.DPRank, err = asRank(t[2]); err != nil {
				return Batch{}, fmt.Errorf("enginekv: batch data_parallel_rank: %w", err)
			}
		}
	case map[string]any:
		if b.TS, err = asFloat(t["ts"]); err != nil {
			return Batch{}, fmt.Errorf("enginekv: batch ts: %w", err)
		}
		if events, err = asList(t["events"]); err != nil {
			return Batch{}, fmt.Errorf("enginekv: batch events: %w", err)
		}
		if r, ok := t["data_parallel_rank"]; ok && r != nil {
			if b.DPRank, err = asRank(r); err != nil {
				return Batch{}, fmt.Errorf("enginekv: batch data_parallel_rank: %w", err)
			}
		}
	default:
		return Batch{}, fmt.Errorf("enginekv: batch is a %T, want an array or a map", v)
	}
	b.Events = make([]Event, 0, len(events))
	for i, raw := range events {
		ev, err := decodeVLLMEvent(raw)
		if err != nil {
			return Batch{}, fmt.Errorf("enginekv: events[%d]: %w", i, err)
		}
		b.Events = append(b.Events, ev)
	}
	return b, nil
}

// vllmFields names the fields of each event type in declaration order (the
// array_like layout); trailing fields with defaults may be omitted.
var vllmFields = map[string][]string{
	"BlockStored": {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
		"medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"},
	"BlockRemoved":     {"block_hashes", "medium", "group_idx"},
	"AllBlocksCleared": {},
}

// decodeVLLMEvent normalizes either layout to a field map, then reads it.
func decodeVLLMEvent(raw any) (Event, error) {
	tag, fields, err := vllmEventFields(raw)
	if err != nil {
		return Event{}, err
	}
	var ev Event
	switch tag {
	case "AllBlocksCleared":
		return Event{Kind: Cleared}, nil
	case "BlockRemoved":
		ev.Kind = Removed
	case "BlockStored":
		ev.Kind = Stored
	}
	if ev.Hashes, err = asHashes(fields["block_hashes"]); err != nil {
		return Event{}, fmt.Errorf("%s.block_hashes: %w", tag, err)
	}
	if m, ok := fields["medium"]; ok && m != nil {
		s, ok := m.(string)
		if !ok {
			return Event{}, fmt.Errorf("%s.medium is a %T, want a string", tag, m)
		}
		if s != "GPU" {
			ev.Medium = s
		}
	}
	if g, ok := fields["group_idx"]; ok && g != nil {
		n, err := asInt(g)
		if err != nil || n < 0 || n > maxGroups {
			return Event{}, fmt.Errorf("%s.group_idx: want 0..%d, got %v", tag, maxGroups, g)
		}
		ev.Group = int(n)
	}
	if k, ok := fields["kv_cache_spec_kind"]; ok && k != nil {
		s, ok := k.(string)
		if !ok {
			return Event{}, fmt.Errorf("%s.kv_cache_spec_kind is a %T, want a string", tag, k)
		}
		ev.SpecKind = s
	}
	if ev.Kind == Removed {
		return ev, nil
	}
	if err := decodeVLLMStored(&ev, fields); err != nil {
		return Event{}, err
	}
	return ev, nil
}

// vllmEventFields reads an event's tag and its fields by name, from the
// array layout (fields in declaration order) or the map layout.
func vllmEventFields(raw any) (string, map[string]any, error) {
	var tag string
	fields := map[string]any{}
	switch t := raw.(type) {
	case []any:
		if len(t) == 0 {
			return "", nil, errors.New("empty event array")
		}
		s, ok := t[0].(string)
		if !ok {
			return "", nil, fmt.Errorf("event tag is a %T, want a string", t[0])
		}
		tag = s
		names, ok := vllmFields[tag]
		if !ok {
			return "", nil, fmt.Errorf("unknown event type %q", tag)
		}
		// Newer engines may append fields we do not know: ignore them.
		for i, v := range t[1:] {
			if i < len(names) {
				fields[names[i]] = v
			}
		}
	case map[string]any:
		s, ok := t["type"].(string)
		if !ok {
			return "", nil, fmt.Errorf("event without a string \"type\" tag")
		}
		tag, fields = s, t
		if _, ok := vllmFields[tag]; !ok {
			return "", nil, fmt.Errorf("unknown event type %q", tag)
		}
	default:
		return "", nil, fmt.Errorf("event is a %T, want an array or a map", raw)
	}
	return tag, fields, nil
}

// decodeVLLMStored reads the fields only a BlockStored has: the parent,
// the token ids, the block size and what else its hashes depend on.
func decodeVLLMStored(ev *Event, fields map[string]any) error {
	var err error
	if p := fields["parent_block_hash"]; p != nil {
		if ev.Parent, err = asHash(p); err != nil {
			return fmt.Errorf("BlockStored.parent_block_hash: %w", err)
		}
		ev.HasParent = true
	}
	toks, err := asList(fields["token_ids"])
	if err != nil {
		return fmt.Errorf("BlockStored.token_ids: %w", err)
	}
	if len(toks) > maxTokensPerEvent {
		return fmt.Errorf("BlockStored.token_ids: %d tokens (max %d)", len(toks), maxTokensPerEvent)
	}
	ev.Tokens = make([]uint32, len(toks))
	for i, t := range toks {
		n, err := asInt(t)
		if err != nil || n < 0 || n > math.MaxUint32 {
			return fmt.Errorf("BlockStored.token_ids[%d]: not a token id (%v)", i, t)
		}
		ev.Tokens[i] = uint32(n)
	}
	bs, err := asInt(fields["block_size"])
	if err != nil || bs <= 0 || bs > 1<<20 {
		return fmt.Errorf("BlockStored.block_size: want a positive integer, got %v", fields["block_size"])
	}
	ev.BlockSize = int(bs)
	// A block computed under a LoRA adapter is keyed by the adapter's name
	// (vLLM hashes lora_name into every block: its extra keys); one named
	// by lora_id alone (SGLang, older vLLM) cannot be keyed.
	if n := fields["lora_name"]; n != nil {
		name, ok := n.(string)
		if !ok || name == "" || len(name) > 4096 {
			return fmt.Errorf("BlockStored.lora_name: want a non-empty string, got %v", n)
		}
		ev.LoRAName = name
	} else if fields["lora_id"] != nil {
		ev.Foreign = true
	}
	if ek, ok := fields["extra_keys"]; ok && ek != nil {
		keys, err := asList(ek)
		if err != nil {
			return fmt.Errorf("BlockStored.extra_keys: %w", err)
		}
		for _, k := range keys {
			if k != nil && !onlyAdapterKey(k, ev.LoRAName) {
				ev.Foreign = true
			}
		}
	}
	return nil
}

func asList(v any) ([]any, error) {
	l, ok := v.([]any)
	if !ok {
		if v == nil {
			return nil, errors.New("missing")
		}
		return nil, fmt.Errorf("a %T, want an array", v)
	}
	return l, nil
}

// loose widens msgpack's integer and float types (nested values keep
// their narrow types) to int64, uint64 and float64.
func loose(v any) any {
	switch n := v.(type) {
	case int8:
		return int64(n)
	case int16:
		return int64(n)
	case int32:
		return int64(n)
	case int:
		return int64(n)
	case uint8:
		return uint64(n)
	case uint16:
		return uint64(n)
	case uint32:
		return uint64(n)
	case uint:
		return uint64(n)
	case float32:
		return float64(n)
	}
	return v
}

func asInt(v any) (int64, error) {
	switch n := loose(v).(type) {
	case int64:
		return n, nil
	case uint64:
		if n > math.MaxInt64 {
			return 0, fmt.Errorf("%d out of range", n)
		}
		return int64(n), nil
	case nil:
		return 0, errors.New("missing")
	}
	return 0, fmt.Errorf("a %T, want an integer", v)
}

func asRank(v any) (int, error) {
	n, err := asInt(v)
	if err != nil {
		return 0, err
	}
	if n < 0 || n > 1<<16 {
		return 0, fmt.Errorf("%d out of range", n)
	}
	return int(n), nil
}

func asFloat(v any) (float64, error) {
	switch n := loose(v).(type) {
	case float64:
		return n, nil
	case int64:
		return float64(n), nil
	case uint64:
		return float64(n), nil
	case nil:
		return 0, errors.New("missing")
	}
	return 0, fmt.Errorf("a %T, want a number", v)
}

func asHash(v any) (Hash, error) {
	switch h := loose(v).(type) {
	case int64:
		return IntHash(uint64(h)), nil
	case uint64:
		return IntHash(h), nil
	case []byte:
		return BytesHash(h), nil
	case string: // some encoders send bytes as str
		return BytesHash([]byte(h)), nil
	}
	return "", fmt.Errorf("a %T, want an integer or bytes", v)
}

func asHashes(v any) ([]Hash, error) {
	l, err := asList(v)
	if err != nil {
		return nil, err
	}
	if len(l) > maxBlocksPerEvent {
		return nil, fmt.Errorf("%d hashes (max %d)", len(l), maxBlocksPerEvent)
	}
	out := make([]Hash, len(l))
	for i, x := range l {
		if out[i], err = asHash(x); err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
	}
	return out, nil
}

// onlyAdapterKey reports whether one block's extra keys are exactly the
// LoRA adapter's name (what vLLM's generate_block_hash_extra_keys gives a
// block of a LoRA request without multimodal inputs or a cache salt).
func onlyAdapterKey(k any, lora string) bool {
	l, ok := k.([]any)
	if !ok || len(l) != 1 || lora == "" {
		return false
	}
	s, ok := l[0].(string)
	return ok && s == lora
}
