package trtllm

import (
	"encoding/json"
	"net/http"
	"sync"
)

// kvEvents is the KV cache manager's event buffer as trtllm-serve drains it
// at POST /kv_cache_events (openai_server.py get_kv_cache_events →
// llm.get_kv_cache_events, each event serialized by tensorrt_llm/_utils.py
// KVCacheEventSerializer): {"event_id", "data", "window_size"}, data one of
// created {num_blocks_per_cache_level}, stored {parent_hash, blocks:
// [{type: stored_block, block_hash, tokens: [{type: unique_token,
// token_id, token_extra_id}], cache_level, priority}]} (the serializer
// leaves lora_id out: "TODO enable serialization of lora_id"), removed
// {block_hashes}, updated {block_hash, cache_level, priority} with each an
// event_diff {new_value, old_value} or null. At most event_buffer_max_size are kept, the oldest
// dropped (the consumer sees the gap in event ids); each is handed out
// once.
type kvEvents struct {
	mu     sync.Mutex
	max    int
	window int
	nextID uint64
	buf    []json.RawMessage
}

type storedBlock struct {
	hash   uint64
	tokens []uint32
}

// newKVEvents starts the buffer with the cache's "created" event: blocks
// on the GPU level, none offloaded. window is the attention window of the
// (one, full-attention) pool.
func newKVEvents(max, window, blocks int) *kvEvents {
	e := &kvEvents{max: max, window: window}
	e.add(map[string]any{"type": "created", "num_blocks_per_cache_level": []int{blocks, 0}})
	return e
}

func (e *kvEvents) add(data any) {
	if e.max <= 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	raw, err := json.Marshal(map[string]any{"event_id": e.nextID, "data": data, "window_size": e.window})
	if err != nil {
		return
	}
	e.nextID++
	e.buf = append(e.buf, raw)
	if len(e.buf) > e.max {
		e.buf = e.buf[len(e.buf)-e.max:]
	}
}

func (e *kvEvents) stored(parent uint64, hasParent bool, blocks []storedBlock) {
	var p any
	if hasParent {
		p = parent
	}
	out := make([]map[string]any, 0, len(blocks))
	for _, b := range blocks {
		toks := make([]map[string]any, len(b.tokens))
		for i, t := range b.tokens {
			toks[i] = map[string]any{"type": "unique_token", "token_id": t, "token_extra_id": 0}
		}
		out = append(out, map[string]any{"type": "stored_block", "block_hash": b.hash, "tokens": toks,
			"cache_level": 0, "priority": 35})
	}
	e.add(map[string]any{"type": "stored", "parent_hash": p, "blocks": out})
}

func (e *kvEvents) removed(hashes []uint64) {
	e.add(map[string]any{"type": "removed", "block_hashes": hashes})
}

// drainKVEvents answers POST /kv_cache_events with every buffered event.
func (s *Server) drainKVEvents(w http.ResponseWriter) {
	s.events.mu.Lock()
	out := s.events.buf
	s.events.buf = nil
	s.events.mu.Unlock()
	if out == nil {
		out = []json.RawMessage{}
	}
	writeJSON(w, http.StatusOK, out)
}
