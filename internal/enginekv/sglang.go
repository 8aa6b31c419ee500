package enginekv

import (
	"errors"
	"fmt"
	"strings"
)

// DecodeSGLang decodes one msgpack KVEventBatch as SGLang's
// ZmqEventPublisher publishes it (python/sglang/srt/disaggregation/
// kv_events.py, the events recorded by python/sglang/srt/mem_cache/
// events.py KVCacheEventRecorder). The envelope is vLLM's ([ts, events,
// attn_dp_rank]); the events are array_like msgspec structs whose fields
// differ from vLLM's after lora_id:
//
//   - BlockStored(block_hashes, parent_block_hash, token_ids, block_size,
//     lora_id, medium) — older releases stop at lora_id; medium names
//     SGLang's tiers (GPU, CPU_PINNED, DISK, EXTERNAL; CPU_TIER1/2 before).
//   - BlockStoredWithMetadata: the same tag, then a metadata map
//     {cache_salt, session_id} (a salted block's hash covers the salt).
//   - BlockStoredWithComponentType(AndMetadata), with
//     --enable-kv-events-component-types: a component name (full, swa,
//     mamba) among the trailing fields, then the metadata map when salted.
//   - BlockRemoved(block_hashes, medium) and BlockRemovedWithComponentType
//     (a component name after it); AllBlocksCleared().
//   - token_ids entries are ids, or (id, next id) pairs for the bigram
//     pages of EAGLE models.
//
// Fields after lora_id are read by their type, not their position, so the
// order of medium and the component name does not matter: a map is the
// metadata, a string one of SGLang's component names the component, a list
// of strings the components, another string the medium; further fields are
// ignored. Tagged maps ({"type": tag, …}, with cache_salt, session_id,
// metadata or component_type as keys) are read too.
//
// As DecodeVLLM, an error means the whole message is unreadable; an event
// that does not decode is listed in Skipped.
func DecodeSGLang(payload []byte) (Batch, error) {
	return decodeBatch(payload, decodeSGLangEvent)
}

// sglangTags maps SGLang's struct tags to the event they are. The
// extended structs declare the base tag (tag="BlockStored"); their class
// names are accepted too.
var sglangTags = map[string]string{
	"BlockStored":                             "BlockStored",
	"BlockStoredWithMetadata":                 "BlockStored",
	"BlockStoredWithComponentType":            "BlockStored",
	"BlockStoredWithComponentTypeAndMetadata": "BlockStored",
	"BlockRemoved":                            "BlockRemoved",
	"BlockRemovedWithComponentType":           "BlockRemoved",
	"AllBlocksCleared":                        "AllBlocksCleared",
}

// sglangPositional are the leading fields of each event in array_like
// order; what follows is read by type.
var sglangPositional = map[string][]string{
	"BlockStored":      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id"},
	"BlockRemoved":     {"block_hashes"},
	"AllBlocksCleared": {},
}

// sglangComponents are SGLang's KV component names
// (mem_cache/unified_cache/component_type.py ComponentType as published)
// and the pool each is tracked as: the group the Mapper keys it by and its
// attention kind in vLLM's words (a full-attention pool is announced).
var sglangComponents = map[string]struct {
	group int
	kind  string
}{
	"full":  {0, "full_attention"},
	"swa":   {1, "sliding_window"},
	"mamba": {2, "mamba"},
}

func decodeSGLangEvent(raw any) (Event, error) {
	var tag string
	fields := map[string]any{}
	var extra []any // array_like fields after the positional ones
	switch t := raw.(type) {
	case []any:
		if len(t) == 0 {
			return Event{}, errors.New("empty event array")
		}
		s, ok := t[0].(string)
		if !ok {
			return Event{}, fmt.Errorf("event tag is a %T, want a string", t[0])
		}
		if tag, ok = sglangTags[s]; !ok {
			return Event{}, unknownEvent(s)
		}
		names := sglangPositional[tag]
		for i, v := range t[1:] {
			if i < len(names) {
				fields[names[i]] = v
			} else {
				extra = append(extra, v)
			}
		}
	case map[string]any:
		s, ok := t["type"].(string)
		if !ok {
			return Event{}, errors.New("event without a string \"type\" tag")
		}
		if tag, ok = sglangTags[s]; !ok {
			return Event{}, unknownEvent(s)
		}
		for _, k := range []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"} {
			if v, ok := t[k]; ok {
				fields[k] = v
			}
		}
		for _, k := range []string{"metadata", "component_type", "component_types"} {
			if v, ok := t[k]; ok && v != nil {
				extra = append(extra, v)
			}
		}
		if salt, ok := t["cache_salt"]; ok && salt != nil {
			extra = append(extra, map[string]any{"cache_salt": salt})
		}
	default:
		return Event{}, fmt.Errorf("event is a %T, want an array or a map", raw)
	}
	salted, err := sglangTrailing(tag, extra, fields)
	if err != nil {
		return Event{}, err
	}
	ev, err := eventFromFields(tag, fields)
	if err != nil {
		return Event{}, err
	}
	if salted {
		ev.Foreign = true // the salt is in the block's hash: no request's keys match it
	}
	return ev, nil
}

// sglangTrailing reads the fields after the positional ones by their type
// into fields (medium, group_idx, kv_cache_spec_kind); salted reports a
// cache_salt in the metadata.
func sglangTrailing(tag string, extra []any, fields map[string]any) (salted bool, err error) {
	component := ""
	for _, v := range extra {
		switch x := v.(type) {
		case nil:
		case map[string]any:
			s, err := metadataSalt(x)
			if err != nil {
				return false, fmt.Errorf("%s.metadata: %w", tag, err)
			}
			salted = salted || s
		case string:
			if _, ok := sglangComponents[strings.ToLower(x)]; ok && component == "" {
				component = strings.ToLower(x)
			} else if _, ok := fields["medium"]; !ok {
				fields["medium"] = x
			}
		case []any:
			if component, err = componentOf(x); err != nil {
				return false, fmt.Errorf("%s.component_types: %w", tag, err)
			}
		}
	}
	if c, ok := sglangComponents[component]; ok {
		fields["group_idx"] = int64(c.group)
		fields["kv_cache_spec_kind"] = c.kind
	}
	return salted, nil
}

// metadataSalt reads BlockStoredMetadata {cache_salt, session_id}: a
// session id does not enter the hash; a salt does.
func metadataSalt(m map[string]any) (bool, error) {
	v, ok := m["cache_salt"]
	if !ok || v == nil {
		return false, nil
	}
	s, ok := v.(string)
	if !ok {
		return false, fmt.Errorf("cache_salt is a %T, want a string", v)
	}
	return s != "", nil
}

// componentOf names the pool of an event listing the components it holds:
// the full-attention one when listed (a block's full KV is what a prefix
// hit reads first), else the first.
func componentOf(l []any) (string, error) {
	first := ""
	for _, v := range l {
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("a %T, want a component name", v)
		}
		s = strings.ToLower(s)
		if s == "full" {
			return s, nil
		}
		if first == "" {
			first = s
		}
	}
	return first, nil
}
