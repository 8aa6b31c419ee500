package enginekv

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-zeromq/zmq4"
)

// EndOfReplay is the replay socket's end-of-replay sequence number (-1 as
// 8 bytes: kv_events.py ZmqEventPublisher.END_SEQ).
const EndOfReplay = ^uint64(0)

// maxReplayBatches bounds one replay (vLLM's default buffer is 10,000).
const maxReplayBatches = 100_000

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// Endpoint is the engine's PUB socket, e.g. tcp://10.0.0.5:5557
	// (vLLM binds tcp://*:5557 + its data-parallel rank).
	Endpoint string
	// ReplayEndpoint is the engine's ROUTER replay socket; empty means
	// gaps cannot be filled and reset the rank's blocks instead.
	ReplayEndpoint string
	// Topic is the publisher's topic ("" = all).
	Topic string
	// ReplayTimeout bounds one replay exchange (default 2 s).
	ReplayTimeout time.Duration
	// Decode decodes a payload (default DecodeVLLM).
	Decode func([]byte) (Batch, error)
	Log    *slog.Logger
}

// Handler receives a Subscriber's output, from one goroutine, in sequence
// order: Batch for each engine batch; Reset when continuity was lost (the
// engine restarted, or events were lost and the replay buffer could not fill
// the gap): everything known about the engine's cache must be dropped
// before the batches that follow are applied.
type Handler interface {
	Batch(seq uint64, b Batch)
	Reset(reason string)
}

// Subscriber consumes one engine's ZeroMQ KV event stream.
type Subscriber struct {
	cfg SubscriberConfig
	log *slog.Logger
}

// NewSubscriber validates cfg.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("enginekv: subscriber: no endpoint")
	}
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = 2 * time.Second
	}
	if cfg.Decode == nil {
		cfg.Decode = DecodeVLLM
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Subscriber{cfg: cfg, log: log.With("kv_events", cfg.Endpoint)}, nil
}

// Run subscribes and delivers to h until ctx is done. It dials with
// retries and, when the connection is lost, dials again and resyncs: the
// first batch after a reconnect resets the rank and replays the engine's
// buffer from sequence 0 (what happened while disconnected is unknown, and
// the engine may have restarted).
func (s *Subscriber) Run(ctx context.Context, h Handler) error {
	tr := tracker{}
	for attempt := 0; ; attempt++ {
		err := s.session(ctx, &tr, h)
		if ctx.Err() != nil {
			return nil
		}
		s.log.Warn("kv events connection lost; reconnecting", "err", err)
		tr.started, tr.resync = false, true
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(min(100*time.Millisecond<<min(attempt, 5), 3*time.Second)):
		}
	}
}

// session is one connection: dial, then receive until an error.
func (s *Subscriber) session(ctx context.Context, tr *tracker, h Handler) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(200*time.Millisecond),
		zmq4.WithDialerTimeout(5*time.Second), zmq4.WithLogger(slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)))
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		return fmt.Errorf("enginekv: subscribe %s: %w", s.cfg.Endpoint, err)
	}
	if err := sub.Dial(s.cfg.Endpoint); err != nil {
		return fmt.Errorf("enginekv: dial %s: %w", s.cfg.Endpoint, err)
	}
	s.log.Info("kv events subscribed")
	for {
		msg, err := sub.Recv()
		if err != nil {
			return fmt.Errorf("enginekv: receive from %s: %w", s.cfg.Endpoint, err)
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			s.log.Warn("kv events: malformed message", "frames", len(msg.Frames))
			continue
		}
		seq := binary.BigEndian.Uint64(msg.Frames[1])
		s.deliver(ctx, tr, seq, s.decode(msg.Frames[2]), h)
	}
}

// decode decodes a payload; a message that does not decode is a batch of
// no events that says so (SkippedBatch): it takes its sequence number like
// any other, so the stream goes on without a reset (the engine's blocks
// known so far stay; what the message said is lost, as a skipped event's).
func (s *Subscriber) decode(payload []byte) Batch {
	b, err := s.cfg.Decode(payload)
	if err != nil {
		return SkippedBatch(err)
	}
	return b
}

// tracker is a stream's sequence state.
type tracker struct {
	started bool
	resync  bool   // reconnected: reset before the next batch
	next    uint64 // the sequence number expected next
}

// deliver applies the sequence rules: in order → deliver; behind → the
// engine restarted (reset); ahead → replay the gap first.
func (s *Subscriber) deliver(ctx context.Context, tr *tracker, seq uint64, b Batch, h Handler) {
	if tr.resync {
		h.Reset("reconnected to the engine")
		tr.resync = false
	}
	switch {
	case tr.started && seq == tr.next:
	case tr.started && seq < tr.next:
		h.Reset(fmt.Sprintf("sequence went back from %d to %d (engine restarted)", tr.next, seq))
		tr.started = false
		fallthrough
	default:
		// First message (from 0 if the worker came up after the engine)
		// or a gap: fetch what we missed.
		from := uint64(0)
		if tr.started {
			from = tr.next
		}
		if seq > from {
			s.fill(ctx, from, seq, h)
		}
	}
	h.Batch(seq, b)
	tr.started, tr.next = true, seq+1
}

// fill replays batches from..to-1 from the replay socket. Without one, or
// when the engine's buffer no longer holds from, continuity is lost: Reset,
// then whatever the buffer still has is applied (it is exact for the blocks
// it covers).
func (s *Subscriber) fill(ctx context.Context, from, to uint64, h Handler) {
	got, err := s.replay(ctx, from, to)
	complete := err == nil && len(got) == int(to-from)
	if !complete && from > 0 {
		reason := fmt.Sprintf("missed batches %d..%d", from, to-1)
		if err != nil {
			reason += ": " + err.Error()
		}
		s.log.Warn("kv events: gap not filled", "reason", reason)
		h.Reset(reason)
	}
	for _, r := range got {
		h.Batch(r.seq, r.batch)
	}
}

type replayed struct {
	seq   uint64
	batch Batch
}

// replay asks the ROUTER socket for batches from `from` and keeps those
// below `to`, in order, stopping at the first hole.
func (s *Subscriber) replay(ctx context.Context, from, to uint64) ([]replayed, error) {
	if s.cfg.ReplayEndpoint == "" {
		return nil, errors.New("no replay endpoint")
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReplayTimeout)
	defer cancel()
	d := zmq4.NewDealer(rctx, zmq4.WithDialerMaxRetries(1), zmq4.WithDialerTimeout(s.cfg.ReplayTimeout),
		zmq4.WithLogger(slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)))
	defer d.Close()
	if err := d.Dial(s.cfg.ReplayEndpoint); err != nil {
		return nil, fmt.Errorf("replay dial %s: %w", s.cfg.ReplayEndpoint, err)
	}
	start := binary.BigEndian.AppendUint64(nil, from)
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, start)); err != nil {
		return nil, fmt.Errorf("replay request: %w", err)
	}
	var out []replayed
	var trimmed error
	next := from
	for n := 0; n < maxReplayBatches; n++ {
		msg, err := d.Recv()
		if err != nil {
			return out, fmt.Errorf("replay receive: %w", context.Cause(rctx))
		}
		frames := msg.Frames
		if len(frames) == 3 && len(frames[0]) == 0 { // [delimiter, seq, payload]
			frames = frames[1:]
		}
		if len(frames) != 2 || len(frames[0]) != 8 {
			return out, fmt.Errorf("replay: malformed reply of %d frames", len(msg.Frames))
		}
		seq := binary.BigEndian.Uint64(frames[0])
		if seq == EndOfReplay {
			return out, trimmed
		}
		if seq < next || seq >= to {
			continue // before the gap, or already live
		}
		if seq > next {
			// The engine's buffer no longer holds the start of the gap:
			// keep what it has (exact for the blocks it covers).
			trimmed = fmt.Errorf("replay starts at %d, want %d (buffer trimmed)", seq, next)
		}
		out = append(out, replayed{seq, s.decode(frames[1])})
		next = seq + 1
	}
	return out, errors.New("replay too long")
}
