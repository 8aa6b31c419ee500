package oaiserve

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/tether-project/tether/worker/kvevents"
)

// Layout is how the engine's msgspec structs are encoded.
type Layout uint8

const (
	// LayoutMap: vllm/distributed/kv_events.py today (msgspec structs
	// with omit_defaults and tag=True: maps with a "type" key; block
	// hashes as bytes; group_idx and kv_cache_spec_kind on stored events).
	LayoutMap Layout = iota + 1
	// LayoutArray: array_like structs ([tag, field, ...], trailing
	// defaults omitted; integer block hashes), as vLLM releases up to
	// mid-2025 (and SGLang's kv_events.py of 2025) encode them:
	// BlockStored(block_hashes, parent_block_hash, token_ids, block_size,
	// lora_id[, medium, lora_name]), BlockRemoved(block_hashes).
	LayoutArray
	// LayoutSGLang: SGLang today (python/sglang/srt/disaggregation/
	// kv_events.py with the events python/sglang/srt/mem_cache/events.py
	// KVCacheEventRecorder records): array_like structs without
	// omit_defaults, BlockStored(block_hashes, parent_block_hash,
	// token_ids, block_size, lora_id=None, medium="GPU"),
	// BlockRemoved(block_hashes, medium="GPU"), the batch's attn_dp_rank;
	// integer hashes. The recorder never names an adapter (lora_id None).
	LayoutSGLang
)

// KVEventsOptions configure the KV event publishers (--kv-events-config
// '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint":
// "tcp://*:P", "replay_endpoint": "tcp://*:R"}').
type KVEventsOptions struct {
	// Layout: 0 is the engine's own (vLLM LayoutMap, SGLang LayoutSGLang).
	Layout Layout
	// Replay opens the ROUTER replay sockets.
	Replay bool
	// Topic is the publisher's topic ("" by default).
	Topic string
}

// startPublishers opens one ZmqEventPublisher per data-parallel rank:
// rank r on the endpoint's port + r (kv_events.py offset_endpoint_port),
// the replay sockets likewise. The transport (multipart [topic, seq,
// payload], the replay ROUTER) is worker/kvevents' vLLM-compatible
// Publisher; the payloads are encoded here, from the upstream struct
// definitions, independently of tether's decoder.
func (s *Server) startPublishers(o KVEventsOptions) error {
	n := s.opts.DataParallelSize
	for attempt := 0; attempt < 50; attempt++ {
		base := 20000 + rand.IntN(30000)
		replayBase := base + n
		var pubs []*kvevents.Publisher
		ok := true
		for r := range n {
			cfg := kvevents.PublisherConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base+r), Topic: o.Topic}
			if o.Replay {
				cfg.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", replayBase+r)
			}
			p, err := kvevents.NewPublisher(cfg)
			if err != nil {
				ok = false
				break
			}
			pubs = append(pubs, p)
		}
		if ok {
			s.pubs = pubs
			if o.Layout == 0 {
				s.opts.KVEvents.Layout = s.eng.eventLayout()
			}
			return nil
		}
		for _, p := range pubs {
			_ = p.Close()
		}
	}
	return fmt.Errorf("no %d consecutive free ports for the KV event publishers", 2*n)
}

// KVEventsEndpoints are rank 0's publisher and replay endpoints ("" without
// replay); rank r publishes on each port + r.
func (s *Server) KVEventsEndpoints() (pub, replay string) {
	if len(s.pubs) == 0 {
		return "", ""
	}
	return s.pubs[0].Endpoint(), s.pubs[0].ReplayEndpoint()
}

// PublishRaw publishes payload as rank's next message, whatever it holds:
// tests use it to put what an engine should not send (an event that does
// not decode) into the stream.
func (s *Server) PublishRaw(rank int, payload []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pubs[rank].PublishRaw(payload)
}

// PublishHeartbeat publishes an empty batch on every rank (a subscriber
// that joined after the last change learns the sequence and replays what
// it missed).
func (s *Server) PublishHeartbeat() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for r := range s.pubs {
		s.sendLocked(r, nil)
	}
}

// publishLocked publishes one batch of rank: evictions, then the stored
// runs (vLLM's block pool frees blocks before the new ones fill), or
// AllBlocksCleared.
func (s *Server) publishLocked(rank int, stored []storedRun, removed []blockHash, cleared bool) {
	if len(s.pubs) == 0 || (len(stored) == 0 && len(removed) == 0 && !cleared) {
		return
	}
	layout := s.opts.KVEvents.Layout
	var events []any
	if cleared {
		events = append(events, tagged(layout, "AllBlocksCleared", nil))
	}
	if len(removed) > 0 {
		hs := hashValues(layout, removed)
		switch layout {
		case LayoutArray:
			events = append(events, []any{"BlockRemoved", hs})
		case LayoutSGLang:
			events = append(events, []any{"BlockRemoved", hs, "GPU"})
		default:
			events = append(events, tagged(layout, "BlockRemoved", [][2]any{{"block_hashes", hs}, {"medium", "GPU"}, {"group_idx", 0}}))
		}
	}
	for _, run := range stored {
		var parent any
		if run.parent != nil {
			parent = hashValues(layout, []blockHash{*run.parent})[0]
		}
		toks := make([]int64, len(run.tokens))
		for i, t := range run.tokens {
			toks[i] = int64(t)
		}
		hs := hashValues(layout, run.hashes)
		var loraID, loraName any
		if run.adapter != "" {
			loraID, loraName = s.loraIDLocked(run.adapter), run.adapter
		}
		if layout == LayoutSGLang {
			events = append(events, []any{"BlockStored", hs, parent, toks, s.opts.BlockSize, nil, "GPU"})
			continue
		}
		if layout == LayoutArray {
			a := []any{"BlockStored", hs, parent, toks, s.opts.BlockSize, loraID}
			if loraName != nil {
				a = append(a, "GPU", loraName)
			}
			events = append(events, a)
			continue
		}
		events = append(events, tagged(layout, "BlockStored", [][2]any{
			{"block_hashes", hs}, {"parent_block_hash", parent}, {"token_ids", toks}, {"block_size", s.opts.BlockSize},
			{"lora_id", loraID}, {"medium", "GPU"}, {"lora_name", loraName}, {"group_idx", 0}, {"kv_cache_spec_kind", "full_attention"},
		}))
	}
	s.sendLocked(rank, events)
}

// sendLocked encodes KVEventBatch(ts, events, data_parallel_rank) — the
// publisher sets data_parallel_rank to its own — and publishes it.
func (s *Server) sendLocked(rank int, events []any) {
	ts := float64(time.Now().UnixNano()) / 1e9
	if events == nil {
		events = []any{}
	}
	var batch any
	if l := s.opts.KVEvents.Layout; l == LayoutArray || l == LayoutSGLang {
		batch = []any{ts, events, rank}
	} else {
		batch = OrderedMap{{"ts", ts}, {"events", events}, {"data_parallel_rank", rank}}
	}
	b, err := msgpack.Marshal(batch)
	if err != nil {
		panic("oaiserve: encoding a KV event batch: " + err.Error())
	}
	_ = s.pubs[rank].PublishRaw(b) // a lost batch is a gap the subscriber replays
}

// tagged is a tag=True struct: in map form "type" first, then the fields
// in declaration order; array_like, the tag then the fields' values.
func tagged(layout Layout, tag string, fields [][2]any) any {
	if layout == LayoutArray || layout == LayoutSGLang {
		a := []any{tag}
		for _, f := range fields {
			a = append(a, f[1])
		}
		return a
	}
	if fields == nil {
		return OrderedMap{{"type", tag}}
	}
	return append(OrderedMap{{"type", tag}}, fields...)
}

// hashValues are the blocks' ExternalBlockHash: bytes in the map layout,
// the hash's first 8 bytes as a signed integer in the array layouts
// (SGLang's hash_str_to_int64).
func hashValues(layout Layout, hs []blockHash) []any {
	out := make([]any, len(hs))
	for i, h := range hs {
		if layout == LayoutArray || layout == LayoutSGLang {
			out[i] = int64(binary.BigEndian.Uint64(h[:8]))
		} else {
			out[i] = append([]byte(nil), h[:]...)
		}
	}
	return out
}

// OrderedMap encodes as a msgpack map with its keys in this order, as
// msgspec writes a struct's fields.
type OrderedMap [][2]any

// EncodeMsgpack implements msgpack.CustomEncoder.
func (m OrderedMap) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(len(m)); err != nil {
		return err
	}
	for _, kv := range m {
		if err := e.EncodeString(kv[0].(string)); err != nil {
			return err
		}
		if err := e.Encode(kv[1]); err != nil {
			return err
		}
	}
	return nil
}
