// Package enginekv reads the KV cache events inference engines publish and
// turns them into tether block keys (internal/prefix chained hashes over
// token ids, the keys an edge computes from a request), per engine rank. It
// is the one mapping from engine events to keys: a `tether worker` in proxy
// mode announces them over NATS (worker/proxy), and an edge fed by the
// engines directly applies them to its KV index (edge/engineevents).
//
// Sources:
//   - vLLM and SGLang: a ZeroMQ SUB socket on the engine's
//     --kv-events-config publisher, msgpack KVEventBatch payloads, gaps
//     filled through the engine's replay ROUTER socket (Subscriber).
//   - TensorRT-LLM: trtllm-serve's POST /kv_cache_events, polled (Poller).
//
// Engine block hashes are opaque and engine-specific. The Mapper bridges
// them to tether keys through the token ids each stored-block event carries
// and its parent chain. See DESIGN.md.
package enginekv

import (
	"encoding/binary"
	"fmt"
)

// Hash is an engine block hash in canonical form, usable as a map key.
// vLLM sends integers or bytes (ExternalBlockHash = bytes | int); both are
// folded into one string space with a type prefix so they cannot collide.
type Hash string

// IntHash is the canonical form of an integer engine hash (signed or
// unsigned 64-bit, two's complement).
func IntHash(v uint64) Hash {
	var b [9]byte
	b[0] = 'i'
	binary.BigEndian.PutUint64(b[1:], v)
	return Hash(b[:])
}

// BytesHash is the canonical form of a bytes engine hash.
func BytesHash(v []byte) Hash { return Hash("b" + string(v)) }

func (h Hash) String() string {
	if len(h) == 9 && h[0] == 'i' {
		return fmt.Sprintf("%d", int64(binary.BigEndian.Uint64([]byte(h[1:]))))
	}
	if len(h) > 0 && h[0] == 'b' {
		return fmt.Sprintf("0x%x", []byte(h[1:]))
	}
	return fmt.Sprintf("%q", string(h))
}

// Kind is an event's type.
type Kind uint8

const (
	// Stored: blocks were added to the cache (BlockStored / "stored").
	Stored Kind = iota + 1
	// Removed: blocks were evicted (BlockRemoved / "removed").
	Removed
	// Cleared: the whole cache was reset (AllBlocksCleared).
	Cleared
)

func (k Kind) String() string {
	switch k {
	case Stored:
		return "stored"
	case Removed:
		return "removed"
	case Cleared:
		return "cleared"
	}
	return "kind(?)"
}

// Event is one engine cache event, engine-neutral.
type Event struct {
	Kind   Kind
	Hashes []Hash // stored or removed blocks, in chain order for Stored
	// Parent is the engine hash of the block before Hashes[0]; HasParent is
	// false for a chain that starts at the beginning of a prompt.
	Parent    Hash
	HasParent bool
	// Tokens are the token ids of the stored blocks, BlockSize per block.
	Tokens    []uint32
	BlockSize int
	// Foreign marks blocks whose engine hash depends on more than the token
	// ids and a LoRA adapter's name (multimodal inputs, a cache salt, an
	// adapter named by id only): an edge cannot compute their keys from a
	// plain request, so they are not announced.
	Foreign bool
	// LoRAName is the adapter the blocks were computed under (vLLM's
	// lora_name; "" the base model): their keys are the adapter's
	// (internal/prefix AdapterBlockHashes), as an edge computes them for a
	// request naming the adapter.
	LoRAName string
	// Medium is the tier the event is about: "" for the GPU (vLLM medium
	// absent or "GPU"), else the engine's name of an offloaded tier (vLLM
	// vllm/v1/kv_offload/mediums.py: "CPU", "Disk"). The Mapper keeps each
	// offloaded medium's blocks apart from the GPU's: a request reuses an
	// offloaded block only after a transfer back, so placement credits it
	// at a lower weight (routing Weights.OffloadedBlock).
	Medium string
	// Group is the KV cache group of a hybrid model (vLLM group_idx, 0
	// when absent); SpecKind is the group's attention kind as the engine
	// names it (vLLM kv_cache_spec_kind on stored events: full_attention,
	// sliding_window, mamba, ...; "" when not stated). Window is the
	// attention window of the event's pool (TensorRT-LLM window_size; 0
	// when not stated). The Mapper tracks only full-attention pools: a
	// sliding-window pool evicts blocks the full-attention pool keeps, and
	// its hashes would otherwise erase them.
	Group    int
	SpecKind string
	Window   int
	// SlidingWindow is a sliding-window group's window in tokens (vLLM
	// kv_cache_spec_sliding_window on stored events; 0 when not stated).
	SlidingWindow int
}

// Offloaded reports whether the event is about a tier other than the GPU.
func (e Event) Offloaded() bool { return e.Medium != "" }

// Batch is one engine message: events in order, and the data-parallel rank
// that produced them when the engine says (vLLM's data_parallel_rank,
// TensorRT-LLM's attention_dp_rank), else -1.
type Batch struct {
	TS     float64
	DPRank int
	Events []Event
	// Skipped lists the events that did not decode (left out of Events),
	// or the whole message (SkippedBatch).
	Skipped []Skip
}
