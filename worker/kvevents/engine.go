package kvevents

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/tether-project/tether/internal/enginekv"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/worker/engine"
)

// Engine wraps an engine (the simulated one) so that it also speaks vLLM's
// KV event protocol: every change to a rank's cache is published on that
// rank's Publisher as a KVEventBatch (BlockStored with the blocks' token
// ids and parent, BlockRemoved, as vLLM's scheduler does). A `tether
// worker` in proxy mode in front of it then exercises the real-engine path
// (worker/kvevents → NATS → the edges' KV index) without a GPU.
//
// The wrapped engine reports stored blocks by tether key only; the tokens
// and parent of each block come from the prompts of the requests running
// (registered before the inner Run) and of the blocks still cached. The
// engine hash published is the tether key itself: the consumer recomputes
// keys from the token ids anyway.
type Engine struct {
	inner     engine.Engine
	blockSize int
	pubs      []*Publisher
	sink      atomic.Pointer[func(engine.KVEvent)]

	mu      sync.Mutex
	pending []map[uint64]*blockInfo // per rank: blocks of running prompts
	held    []map[uint64]blockInfo  // per rank: blocks announced and not removed
	unknown atomic.Uint64
	trt     *trtBuffer // nil unless ServeTRTLLM
}

type blockInfo struct {
	parent uint64 // 0: first block of a prompt
	tokens []uint32
	refs   int    // running requests naming the block (pending only)
	lora   string // the adapter the block was computed under
}

// NewEngine wraps inner, whose ranks publish on pubs (one per rank, or
// none when only ServeTRTLLM is wanted).
func NewEngine(inner engine.Engine, blockSize int, pubs []*Publisher) (*Engine, error) {
	ranks := len(inner.Stats())
	if len(pubs) != 0 && ranks != len(pubs) {
		return nil, fmt.Errorf("kvevents: %d publishers for %d ranks", len(pubs), ranks)
	}
	if blockSize <= 0 {
		return nil, fmt.Errorf("kvevents: block size %d", blockSize)
	}
	e := &Engine{inner: inner, blockSize: blockSize, pubs: pubs}
	for range ranks {
		e.pending = append(e.pending, map[uint64]*blockInfo{})
		e.held = append(e.held, map[uint64]blockInfo{})
	}
	inner.SetKVEventSink(e.onKV)
	return e, nil
}

var _ engine.Engine = (*Engine)(nil)

// ServeTRTLLM also buffers the changes as TensorRT-LLM events (at most
// maxEvents, oldest dropped) for KVCacheEventsHandler, as trtllm-serve's
// POST /kv_cache_events serves them. Call it before the first Run.
func (e *Engine) ServeTRTLLM(maxEvents int) {
	if maxEvents <= 0 {
		maxEvents = 10_000
	}
	e.mu.Lock()
	e.trt = newTRTBuffer(len(e.pending), maxEvents)
	e.mu.Unlock()
}

func (e *Engine) trtBuf() *trtBuffer {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.trt
}

// KVCacheEventsHandler drains the TensorRT-LLM event buffer (nil without
// ServeTRTLLM): the worker serves it at POST /kv_cache_events.
func (e *Engine) KVCacheEventsHandler() http.HandlerFunc {
	if t := e.trtBuf(); t != nil {
		return t.drain
	}
	return nil
}

// Endpoints are the ranks' PUB and replay endpoints as bound.
func (e *Engine) Endpoints() (pub, replay []string) {
	for _, p := range e.pubs {
		pub, replay = append(pub, p.Endpoint()), append(replay, p.ReplayEndpoint())
	}
	return pub, replay
}

// PublishEmpty publishes an empty batch on rank r (a heartbeat: a
// subscriber that joined late replays what it missed when it sees it).
func (e *Engine) PublishEmpty(r int) error {
	if r < 0 || r >= len(e.pubs) {
		return fmt.Errorf("kvevents: rank %d of %d", r, len(e.pubs))
	}
	return e.pubs[r].Publish(enginekv.Batch{DPRank: -1})
}

// Unknown counts stored blocks whose tokens were not known (not announced).
func (e *Engine) Unknown() uint64 { return e.unknown.Load() }

// Run registers the prompt's blocks, then runs the request on the inner engine.
func (e *Engine) Run(ctx context.Context, req engine.Request, emit func(engine.Chunk) error) (engine.Completion, error) {
	if req.Rank < 0 || req.Rank >= len(e.pending) {
		return e.inner.Run(ctx, req, emit) // the inner engine explains
	}
	hashes := prefix.AdapterBlockHashes(req.Adapter, req.Prompt, e.blockSize)
	e.mu.Lock()
	p := e.pending[req.Rank]
	for i, h := range hashes {
		if bi, ok := p[h]; ok {
			bi.refs++
			continue
		}
		var parent uint64
		if i > 0 {
			parent = hashes[i-1]
		}
		p[h] = &blockInfo{parent: parent, tokens: req.Prompt[i*e.blockSize : (i+1)*e.blockSize], refs: 1, lora: req.Adapter}
	}
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		for _, h := range hashes {
			if bi := p[h]; bi != nil {
				if bi.refs--; bi.refs <= 0 {
					delete(p, h)
				}
			}
		}
		e.mu.Unlock()
	}()
	return e.inner.Run(ctx, req, emit)
}

// onKV is the inner engine's sink: publish the change in vLLM's format,
// then pass it on.
func (e *Engine) onKV(ev engine.KVEvent) {
	if ev.Rank >= 0 && ev.Rank < len(e.pending) {
		if b := e.batch(ev); len(b.Events) > 0 {
			if len(e.pubs) > 0 {
				_ = e.pubs[ev.Rank].Publish(b) // a lost batch is a gap the consumer replays
			}
			if t := e.trtBuf(); t != nil {
				t.addBatch(ev.Rank, b)
			}
		}
	}
	if fn := e.sink.Load(); fn != nil {
		(*fn)(ev)
	}
}

// batch converts one change: removals first (as engine.KVEvent applies
// them), then stored blocks as BlockStored events, one per run of blocks
// chained to each other.
func (e *Engine) batch(ev engine.KVEvent) enginekv.Batch {
	b := enginekv.Batch{DPRank: -1}
	e.mu.Lock()
	defer e.mu.Unlock()
	held, pending := e.held[ev.Rank], e.pending[ev.Rank]
	if len(ev.Removed) > 0 {
		rm := enginekv.Event{Kind: enginekv.Removed}
		for _, h := range ev.Removed {
			delete(held, h)
			rm.Hashes = append(rm.Hashes, enginekv.IntHash(h))
		}
		b.Events = append(b.Events, rm)
	}
	cur := -1 // index of the BlockStored event being extended
	var last uint64
	for _, h := range ev.Stored {
		var bi blockInfo
		if p := pending[h]; p != nil {
			bi = blockInfo{parent: p.parent, tokens: p.tokens, lora: p.lora}
		} else if x, ok := held[h]; ok {
			bi = x
		} else {
			e.unknown.Add(1)
			cur = -1
			continue
		}
		held[h] = bi
		if cur < 0 || bi.parent != last || b.Events[cur].LoRAName != bi.lora {
			b.Events = append(b.Events, enginekv.Event{Kind: enginekv.Stored, BlockSize: e.blockSize, Parent: enginekv.IntHash(bi.parent), HasParent: bi.parent != 0, LoRAName: bi.lora})
			cur = len(b.Events) - 1
		}
		b.Events[cur].Hashes = append(b.Events[cur].Hashes, enginekv.IntHash(h))
		b.Events[cur].Tokens = append(b.Events[cur].Tokens, bi.tokens...)
		last = h
	}
	return b
}

// AdapterRanks passes the inner engine's adapter slots on
// (engine.AdapterHolder; none when it holds no adapters).
func (e *Engine) AdapterRanks(adapter string) []bool {
	if ah, ok := e.inner.(engine.AdapterHolder); ok {
		return ah.AdapterRanks(adapter)
	}
	return nil
}

// Stats reports the inner engine's figures.
func (e *Engine) Stats() []engine.RankStats { return e.inner.Stats() }

// SetKVEventSink registers a sink that also receives the inner engine's
// native events (a worker publishing them over NATS itself).
func (e *Engine) SetKVEventSink(fn func(engine.KVEvent)) {
	if fn == nil {
		e.sink.Store(nil)
		return
	}
	e.sink.Store(&fn)
}

// Close closes the inner engine and the publishers.
func (e *Engine) Close() error {
	err := e.inner.Close()
	for _, p := range e.pubs {
		if perr := p.Close(); err == nil {
			err = perr
		}
	}
	return err
}
