package kvevents

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"

	"github.com/tether-project/tether/internal/enginekv"
)

// trtBuffer holds TensorRT-LLM-format events until trtllm-serve's
// POST /kv_cache_events drains them. Like TensorRT-LLM's
// event_buffer_max_size it is bounded: the oldest events are dropped, and
// the consumer sees the gap in event ids.
type trtBuffer struct {
	mu     sync.Mutex
	max    int
	nextID []uint64 // per rank
	events []json.RawMessage
}

type trtStoredBlock struct {
	Type       string     `json:"type"`
	BlockHash  uint64     `json:"block_hash"`
	Tokens     []trtToken `json:"tokens"`
	CacheLevel int        `json:"cache_level"`
	Priority   int        `json:"priority"`
}

type trtToken struct {
	Type         string `json:"type"`
	TokenID      uint32 `json:"token_id"`
	TokenExtraID int    `json:"token_extra_id"`
}

func newTRTBuffer(ranks, max int) *trtBuffer {
	b := &trtBuffer{max: max, nextID: make([]uint64, ranks)}
	for r := range ranks {
		b.add(r, map[string]any{"type": "created", "num_blocks_per_cache_level": []int{0, 0}})
	}
	return b
}

// add appends one event of rank r (under no lock of the caller's).
func (b *trtBuffer) add(r int, data any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ev := map[string]any{"event_id": b.nextID[r], "data": data, "window_size": 0}
	if len(b.nextID) > 1 {
		ev["attention_dp_rank"] = r
	}
	b.nextID[r]++
	raw, err := json.Marshal(ev)
	if err != nil {
		return
	}
	b.events = append(b.events, raw)
	if len(b.events) > b.max {
		b.events = b.events[len(b.events)-b.max:]
	}
}

// addBatch converts one vLLM-style batch of rank r.
func (b *trtBuffer) addBatch(r int, batch enginekv.Batch) {
	for _, ev := range batch.Events {
		switch ev.Kind {
		case enginekv.Removed:
			hs := make([]uint64, 0, len(ev.Hashes))
			for _, h := range ev.Hashes {
				if v, ok := intHash(h); ok {
					hs = append(hs, v)
				}
			}
			b.add(r, map[string]any{"type": "removed", "block_hashes": hs})
		case enginekv.Stored:
			var parent any
			if ev.HasParent {
				if v, ok := intHash(ev.Parent); ok {
					parent = v
				}
			}
			blocks := make([]trtStoredBlock, 0, len(ev.Hashes))
			for i, h := range ev.Hashes {
				v, _ := intHash(h)
				blk := trtStoredBlock{Type: "stored_block", BlockHash: v, Priority: 35}
				for _, t := range ev.Tokens[i*ev.BlockSize : (i+1)*ev.BlockSize] {
					blk.Tokens = append(blk.Tokens, trtToken{Type: "unique_token", TokenID: t})
				}
				blocks = append(blocks, blk)
			}
			b.add(r, map[string]any{"type": "stored", "parent_hash": parent, "blocks": blocks})
		}
	}
}

// drain answers POST /kv_cache_events with every buffered event.
func (b *trtBuffer) drain(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	events := b.events
	b.events = nil
	b.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	out := make([]byte, 0, 64*len(events)+2)
	out = append(out, '[')
	for i, e := range events {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, e...)
	}
	out = append(out, ']')
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	_, _ = w.Write(out)
}

func intHash(h enginekv.Hash) (uint64, bool) {
	if len(h) == 9 && h[0] == 'i' {
		var v uint64
		for _, c := range []byte(h[1:]) {
			v = v<<8 | uint64(c)
		}
		return v, true
	}
	return 0, false
}
