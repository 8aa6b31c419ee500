package sim

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/worker/engine"
)

// Engine is the simulated engine.Engine: one VirtualRank per ADP rank,
// driven by engine time = wall time since New / TimeScale. A Run admits its
// request to the rank's VirtualRank (which computes queueing, prefill and
// decode from the cache), then waits until each computed instant, streaming
// one chunk per token. With TimeScale 0 nothing waits; engine time then
// advances to each finished request's completion time, so sequential runs
// see each other's caches, queues and windows exactly as in virtual time.
type Engine struct {
	cfg       Config
	ranks     []*rankDriver
	wallStart time.Time
	floor     atomic.Int64 // engine time reached by finished runs (ns)
	sink      atomic.Pointer[func(engine.KVEvent)]
	closed    chan struct{}
	closeOnce sync.Once
}

type rankDriver struct {
	mu        sync.Mutex // guards vr and nextEvent
	vr        *VirtualRank
	nextEvent uint64 // sequence number of the next KV event of this rank

	// The sink runs outside mu (it may call Stats), yet must see a rank's
	// events in the order the cache changed: each event takes a number
	// under mu and waits its turn here.
	turnMu    sync.Mutex
	turn      *sync.Cond
	delivered uint64
}

var _ engine.Engine = (*Engine)(nil)

// New returns a simulated engine; see Config for defaults.
func New(cfg Config) (*Engine, error) {
	c, err := cfg.normalized()
	if err != nil {
		return nil, err
	}
	e := &Engine{cfg: c, wallStart: time.Now(), closed: make(chan struct{})}
	for r := 0; r < c.Ranks; r++ {
		vr, err := NewVirtualRank(r, c)
		if err != nil {
			return nil, err
		}
		rd := &rankDriver{vr: vr}
		rd.turn = sync.NewCond(&rd.turnMu)
		e.ranks = append(e.ranks, rd)
	}
	return e, nil
}

// Config returns the engine's configuration with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// now is the current engine time.
func (e *Engine) now() time.Duration {
	t := time.Duration(e.floor.Load())
	if e.cfg.TimeScale > 0 {
		t = max(t, time.Duration(float64(time.Since(e.wallStart))/e.cfg.TimeScale))
	}
	return t
}

func (e *Engine) advanceFloor(t time.Duration) {
	for {
		old := e.floor.Load()
		if int64(t) <= old || e.floor.CompareAndSwap(old, int64(t)) {
			return
		}
	}
}

// SetKVEventSink registers fn for every change to the ranks' caches. It is
// called synchronously, outside the rank's lock, in the order of changes.
func (e *Engine) SetKVEventSink(fn func(engine.KVEvent)) {
	if fn == nil {
		e.sink.Store(nil)
		return
	}
	e.sink.Store(&fn)
}

// Stats returns every rank's figures at the current engine time.
func (e *Engine) Stats() []engine.RankStats {
	now := e.now()
	out := make([]engine.RankStats, len(e.ranks))
	for i, rd := range e.ranks {
		rd.mu.Lock()
		out[i] = rd.vr.Stats(now)
		rd.mu.Unlock()
	}
	return out
}

// CachedPrefix returns, per rank, the prompt's leading tokens the rank's
// cache holds (engine.RankPrefixer).
func (e *Engine) CachedPrefix(prompt []uint32) []int {
	hashes := prefix.BlockHashes(prompt, e.cfg.BlockSize)
	out := make([]int, len(e.ranks))
	for i, rd := range e.ranks {
		rd.mu.Lock()
		n := rd.vr.Match(hashes)
		rd.mu.Unlock()
		out[i] = min(n*e.cfg.BlockSize, len(prompt))
	}
	return out
}

// AdapterRanks reports, per rank, whether it holds adapter in a slot
// (engine.AdapterHolder).
func (e *Engine) AdapterRanks(adapter string) []bool {
	out := make([]bool, len(e.ranks))
	for i, rd := range e.ranks {
		rd.mu.Lock()
		out[i] = rd.vr.HoldsAdapter(adapter)
		rd.mu.Unlock()
	}
	return out
}

// Close makes running requests release their blocks and return ErrClosed,
// and later Runs fail with ErrClosed.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() { close(e.closed) })
	return nil
}

// Run executes req; see engine.Engine.
func (e *Engine) Run(ctx context.Context, req engine.Request, emit func(engine.Chunk) error) (engine.Completion, error) {
	if err := e.check(ctx, req); err != nil {
		return engine.Completion{}, err
	}
	vreq, seed, err := e.prepare(req)
	if err != nil {
		return engine.Completion{}, fmt.Errorf("sim: request %s: %w", req.ID, err)
	}
	var plan *outputPlan
	if req.Output != nil && req.Phase != engine.PhaseContextOnly {
		// The context phase produces one token; the generation side (or
		// an aggregated run) answers in the shape the options ask for.
		seed = mixSeed(seed, req.Output)
		pl := planOutput(seed, req.MaxTokens, req.Output)
		plan = &pl
		vreq.OutputTokens = pl.tokens()
	}
	rd := e.ranks[req.Rank]
	res, err := e.admit(rd, req.Rank, vreq)
	if err != nil {
		return engine.Completion{}, fmt.Errorf("sim: request %s: %w", req.ID, err)
	}
	c := engine.Completion{
		PromptTokens:     vreq.PromptTokens,
		CachedTokens:     res.CachedTokens,
		CompletionTokens: res.CompletionTokens,
		FinishReason:     "length",
		Queue:            res.Queue,
		Prefill:          res.Prefill,
		Transfer:         res.Transfer,
		Decode:           res.Decode,
		TransferTokens:   res.TransferTokens,
	}
	if err := e.play(ctx, res, seed, plan, emit); err != nil {
		rd.mu.Lock()
		rd.vr.cancel(res.id, e.now())
		rd.mu.Unlock()
		return engine.Completion{}, err
	}
	e.advanceFloor(res.DoneAt)
	rd.mu.Lock()
	rd.vr.Advance(e.now())
	rd.mu.Unlock()

	c.Text = outputText(seed, res.CompletionTokens)
	if plan != nil {
		c.FinishReason = plan.finish
		if plan.words == 0 {
			c.Text, c.ToolCalls = plan.text, plan.calls
		}
	}
	if req.Phase == engine.PhaseContextOnly {
		c.ContextState = contextState{
			blockSize: e.cfg.BlockSize, promptTokens: vreq.PromptTokens, seed: seed, hashes: vreq.Hashes,
		}.encode()
	}
	return c, nil
}

// check refuses a request the engine cannot run: closed, cancelled, on a
// rank it does not have, or asking for no token.
func (e *Engine) check(ctx context.Context, req engine.Request) error {
	select {
	case <-e.closed:
		return ErrClosed
	default:
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if req.Rank < 0 || req.Rank >= len(e.ranks) {
		return fmt.Errorf("sim: request %s: rank %d, the engine has ranks 0..%d: %w",
			req.ID, req.Rank, len(e.ranks)-1, ErrInvalidRequest)
	}
	if req.MaxTokens < 1 {
		return fmt.Errorf("sim: request %s: max tokens must be at least 1, got %d: %w",
			req.ID, req.MaxTokens, ErrInvalidRequest)
	}
	return nil
}

// admit schedules vreq on rank rd and publishes the KV event its admission
// makes (blocks stored and evicted), in the rank's event order.
func (e *Engine) admit(rd *rankDriver, rank int, vreq VirtualRequest) (VirtualResult, error) {
	rd.mu.Lock()
	res, err := rd.vr.Admit(e.now(), vreq)
	if err != nil {
		rd.mu.Unlock()
		return res, err
	}
	hasEvent := len(res.Stored) > 0 || len(res.Removed) > 0
	var eventSeq uint64
	if hasEvent {
		eventSeq = rd.nextEvent
		rd.nextEvent++
	}
	rd.mu.Unlock()
	if hasEvent {
		rd.publish(eventSeq, e.sink.Load(), engine.KVEvent{Rank: rank, Stored: res.Stored, Removed: res.Removed})
	}
	return res, nil
}

// publish delivers event number seq of the rank after all earlier ones.
func (rd *rankDriver) publish(seq uint64, sink *func(engine.KVEvent), ev engine.KVEvent) {
	rd.turnMu.Lock()
	for rd.delivered != seq {
		rd.turn.Wait()
	}
	rd.turnMu.Unlock()
	if sink != nil {
		(*sink)(ev)
	}
	rd.turnMu.Lock()
	rd.delivered++
	rd.turn.Broadcast()
	rd.turnMu.Unlock()
}

// prepare turns an engine request into the rank's request and the output seed.
func (e *Engine) prepare(req engine.Request) (VirtualRequest, uint64, error) {
	v := VirtualRequest{Phase: req.Phase, OutputTokens: req.MaxTokens, Adapter: req.Adapter}
	switch req.Phase {
	case engine.PhaseAggregated, engine.PhaseContextOnly:
		v.PromptTokens = len(req.Prompt)
		v.Hashes = prefix.AdapterBlockHashes(req.Adapter, req.Prompt, e.cfg.BlockSize)
		return v, promptSeed(req.Prompt), nil
	case engine.PhaseGenerationOnly:
		if len(req.ContextState) == 0 {
			return v, 0, fmt.Errorf("generation-only run without context state: %w", ErrInvalidRequest)
		}
		st, err := decodeContextState(req.ContextState)
		if err != nil {
			return v, 0, err
		}
		if st.blockSize != e.cfg.BlockSize {
			return v, 0, fmt.Errorf("context state block size %d, this engine uses %d: %w", st.blockSize, e.cfg.BlockSize, ErrInvalidRequest)
		}
		if len(req.Prompt) > 0 && (promptSeed(req.Prompt) != st.seed || len(req.Prompt) != st.promptTokens ||
			!slices.Equal(prefix.AdapterBlockHashes(req.Adapter, req.Prompt, st.blockSize), st.hashes)) {
			return v, 0, fmt.Errorf("context state was produced for a different prompt: %w", ErrInvalidRequest)
		}
		v.PromptTokens, v.Hashes = st.promptTokens, st.hashes
		return v, st.seed, nil
	}
	return v, 0, fmt.Errorf("unknown phase %d: %w", req.Phase, ErrInvalidRequest)
}

// play waits until each computed instant of res and emits its tokens.
func (e *Engine) play(ctx context.Context, res VirtualResult, seed uint64, plan *outputPlan, emit func(engine.Chunk) error) error {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	waitUntil := func(at time.Duration) error {
		var wait time.Duration
		if e.cfg.TimeScale > 0 {
			wait = time.Until(e.wallStart.Add(time.Duration(float64(at) * e.cfg.TimeScale)))
		}
		if wait <= 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-e.closed:
				return ErrClosed
			default:
				return nil
			}
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-e.closed:
			return ErrClosed
		case <-timer.C:
			return nil
		}
	}
	for i := 0; i < res.CompletionTokens; i++ {
		if err := waitUntil(res.FirstTokenAt + time.Duration(i)*res.TokenTime); err != nil {
			return err
		}
		if emit == nil {
			continue
		}
		ch := engine.Chunk{Text: outputChunk(seed, i)}
		if plan != nil {
			ch = plan.chunk(seed, i)
		}
		if err := emit(ch); err != nil {
			return fmt.Errorf("sim: emit token %d: %w", i, err)
		}
	}
	return nil
}
