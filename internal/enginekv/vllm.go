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
	maxEventsPerBatch = 1 << 20
)

// DecodeVLLM decodes one msgpack KVEventBatch as published by vLLM's
// ZmqEventPublisher (vllm/distributed/kv_events.py). Both msgspec layouts
// are accepted: array_like structs (vLLM up to mid-2025: [ts, events,
// dp_rank?], each event [tag, field...]) and maps (current vLLM: {"ts":…,
// "events":…, "data_parallel_rank":…}, each event {"type": tag, field: …}).
//
// An error means the batch as a whole is unreadable (not msgpack, not a
// batch). An event that does not decode is left out of Events and listed in
// Skipped with its reason; the others are returned (see DESIGN.md).
func DecodeVLLM(payload []byte) (Batch, error) {
	return decodeBatch(payload, decodeVLLMEvent)
}

// decodeBatch reads the KVEventBatch envelope both engines share and
// decodes each event with decodeEvent, skipping those that fail.
func decodeBatch(payload []byte, decodeEvent func(any) (Event, error)) (Batch, error) {
	if len(payload) > MaxPayloadBytes {
		return Batch{}, fmt.Errorf("enginekv: payload of %d bytes (max %d)", len(payload), MaxPayloadBytes)
	}
	if err := checkMsgpack(payload); err != nil {
		return Batch{}, fmt.Errorf("enginekv: %w", err)
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
		// vLLM names the rank data_parallel_rank, SGLang attn_dp_rank.
		for _, k := range []string{"data_parallel_rank", "attn_dp_rank"} {
			if r, ok := t[k]; ok && r != nil {
				if b.DPRank, err = asRank(r); err != nil {
					return Batch{}, fmt.Errorf("enginekv: batch %s: %w", k, err)
				}
				break
			}
		}
	default:
		return Batch{}, fmt.Errorf("enginekv: batch is a %T, want an array or a map", v)
	}
	if len(events) > maxEventsPerBatch {
		return Batch{}, fmt.Errorf("enginekv: %d events in one batch (max %d)", len(events), maxEventsPerBatch)
	}
	b.Events = make([]Event, 0, len(events))
	for i, raw := range events {
		ev, err := decodeEvent(raw)
		if err != nil {
			b.Skipped = append(b.Skipped, Skip{Index: i, Reason: skipReason(err), Err: err.Error()})
			continue
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
	return eventFromFields(tag, fields)
}

// eventFromFields reads an event of a known tag from its fields by vLLM's
// names (SGLang's are normalized to them first).
func eventFromFields(tag string, fields map[string]any) (Event, error) {
	var err error
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
	if w, ok := fields["kv_cache_spec_sliding_window"]; ok && w != nil {
		n, err := asInt(w)
		if err != nil || n < 0 || n > 1<<30 {
			return Event{}, fmt.Errorf("%s.kv_cache_spec_sliding_window: want a window in tokens, got %v", tag, w)
		}
		ev.SlidingWindow = int(n)
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
			return "", nil, unknownEvent(tag)
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
			return "", nil, unknownEvent(tag)
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
	if ev.Tokens, err = asTokens(fields["token_ids"]); err != nil {
		return fmt.Errorf("BlockStored.token_ids: %w", err)
	}
	// vLLM's OffloadingConnector announces an offloaded copy with no token
	// ids and block_size 0 (offloading_connector.py take_events).
	if len(ev.Tokens) == 0 && isZero(fields["block_size"]) {
		ev.BlockSize = 0
	} else if ev.BlockSize, err = asBlockSize(fields["block_size"]); err != nil {
		return fmt.Errorf("BlockStored.block_size: %w", err)
	}
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
