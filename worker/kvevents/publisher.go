package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/tether-project/tether/internal/prefix"
	"io"
	"log"
	"net"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/tether-project/tether/internal/enginekv"
)

// Layout is a msgspec struct encoding.
type Layout uint8

const (
	// LayoutMap encodes structs as maps with a "type" tag (current vLLM).
	LayoutMap Layout = iota
	// LayoutArray encodes array_like structs (SGLang, earlier vLLM).
	LayoutArray
)

// EncodeVLLM encodes b as a vLLM KVEventBatch payload. Integer engine
// hashes are sent as msgpack integers, others as bytes. Stored events
// carry medium "GPU", and an adapter's blocks its lora_name (lora_id: a
// number derived from the name, as vLLM's ids are the engine's own).
func EncodeVLLM(b enginekv.Batch, layout Layout) ([]byte, error) {
	events := make([]any, 0, len(b.Events))
	for i, ev := range b.Events {
		e, err := encodeEvent(ev, layout)
		if err != nil {
			return nil, fmt.Errorf("kvevents: encode events[%d]: %w", i, err)
		}
		events = append(events, e)
	}
	var v any
	var dp any
	if b.DPRank >= 0 {
		dp = b.DPRank
	}
	if layout == LayoutArray {
		batch := []any{b.TS, events}
		if dp != nil {
			batch = append(batch, dp)
		}
		v = batch
	} else {
		m := map[string]any{"ts": b.TS, "events": events}
		if dp != nil {
			m["data_parallel_rank"] = dp
		}
		v = m
	}
	return msgpack.Marshal(v)
}

func hashValue(h enginekv.Hash) any {
	if len(h) == 9 && h[0] == 'i' {
		return int64(binary.BigEndian.Uint64([]byte(h[1:])))
	}
	if len(h) > 0 && h[0] == 'b' {
		return []byte(h[1:])
	}
	return []byte(h)
}

func encodeEvent(ev enginekv.Event, layout Layout) (any, error) {
	hashes := make([]any, len(ev.Hashes))
	for i, h := range ev.Hashes {
		hashes[i] = hashValue(h)
	}
	medium := "GPU"
	if ev.Offloaded() {
		medium = ev.Medium
	}
	switch ev.Kind {
	case enginekv.Cleared:
		if layout == LayoutArray {
			return []any{"AllBlocksCleared"}, nil
		}
		return map[string]any{"type": "AllBlocksCleared"}, nil
	case enginekv.Removed:
		if layout == LayoutArray {
			a := []any{"BlockRemoved", hashes, medium}
			if ev.Group != 0 {
				a = append(a, ev.Group)
			}
			return a, nil
		}
		m := map[string]any{"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}
		if ev.Group != 0 {
			m["group_idx"] = ev.Group
		}
		return m, nil
	case enginekv.Stored:
		var parent any
		if ev.HasParent {
			parent = hashValue(ev.Parent)
		}
		toks := make([]any, len(ev.Tokens))
		for i, t := range ev.Tokens {
			toks[i] = int64(t)
		}
		var loraID, loraName any
		if ev.LoRAName != "" {
			loraID, loraName = int64(prefix.AdapterSeed(ev.LoRAName)>>33)+1, ev.LoRAName
		}
		grouped := ev.Group != 0 || ev.SpecKind != ""
		if layout == LayoutArray {
			a := []any{"BlockStored", hashes, parent, toks, ev.BlockSize, loraID, medium, loraName}
			if grouped {
				a = append(a, nil, ev.Group, ev.SpecKind)
			}
			return a, nil
		}
		m := map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
			"token_ids": toks, "block_size": ev.BlockSize, "lora_id": loraID, "medium": medium, "lora_name": loraName}
		if grouped {
			m["group_idx"], m["kv_cache_spec_kind"] = ev.Group, ev.SpecKind
		}
		return m, nil
	}
	return nil, fmt.Errorf("unknown kind %d", ev.Kind)
}

// Publisher is a vLLM-compatible KV event publisher (PUB socket plus a
// ROUTER replay socket with a bounded buffer), as
// vllm/distributed/kv_events.py's ZmqEventPublisher: the simulated engine
// speaks the real engines' protocol through it, and tests use it.
type Publisher struct {
	pub, router zmq4.Socket
	topic       []byte
	layout      Layout
	cancel      context.CancelFunc
	done        chan struct{}

	mu     sync.Mutex
	seq    uint64 // next sequence number
	buf    []replayEntry
	bufCap int
}

type replayEntry struct {
	seq     uint64
	payload []byte
}

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	Endpoint       string // PUB listen endpoint, e.g. tcp://127.0.0.1:0
	ReplayEndpoint string // ROUTER listen endpoint; "" = no replay
	Topic          string
	BufferSteps    int // batches kept for replay (default 10,000)
	Layout         Layout
}

// listenAddr turns vLLM's bind-everywhere form tcp://*:port into one Go's
// listener accepts.
func listenAddr(endpoint string) string {
	if rest, ok := strings.CutPrefix(endpoint, "tcp://*:"); ok {
		return "tcp://0.0.0.0:" + rest
	}
	return endpoint
}

// NewPublisher listens on the configured endpoints.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	cfg.Endpoint, cfg.ReplayEndpoint = listenAddr(cfg.Endpoint), listenAddr(cfg.ReplayEndpoint)
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = 10_000
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{topic: []byte(cfg.Topic), layout: cfg.Layout, cancel: cancel, done: make(chan struct{}), bufCap: cfg.BufferSteps}
	// zmq4 logs every peer that goes away (a subscriber's replay socket,
	// say) on standard error: nothing a publisher acts on.
	quiet := zmq4.WithLogger(log.New(io.Discard, "", 0))
	p.pub = zmq4.NewPub(ctx, quiet)
	if err := p.pub.Listen(cfg.Endpoint); err != nil {
		cancel()
		p.pub.Close()
		return nil, fmt.Errorf("kvevents: publisher listen %s: %w", cfg.Endpoint, err)
	}
	if cfg.ReplayEndpoint == "" {
		close(p.done)
		return p, nil
	}
	p.router = zmq4.NewRouter(ctx, quiet)
	if err := p.router.Listen(cfg.ReplayEndpoint); err != nil {
		cancel()
		p.pub.Close()
		p.router.Close()
		return nil, fmt.Errorf("kvevents: publisher replay listen %s: %w", cfg.ReplayEndpoint, err)
	}
	go p.serveReplay(ctx)
	return p, nil
}

// Endpoint is the PUB socket's address as tcp://host:port.
func (p *Publisher) Endpoint() string { return tcpAddr(p.pub.Addr()) }

// ReplayEndpoint is the ROUTER socket's address ("" without replay).
func (p *Publisher) ReplayEndpoint() string {
	if p.router == nil {
		return ""
	}
	return tcpAddr(p.router.Addr())
}

func tcpAddr(a net.Addr) string {
	if a == nil {
		return ""
	}
	return "tcp://" + a.String()
}

// Publish encodes and sends b with the next sequence number.
func (p *Publisher) Publish(b enginekv.Batch) error {
	payload, err := EncodeVLLM(b, p.layout)
	if err != nil {
		return err
	}
	return p.PublishRaw(payload)
}

// PublishRaw sends an already encoded payload with the next sequence number.
func (p *Publisher) PublishRaw(payload []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq
	p.seq++
	p.buf = append(p.buf, replayEntry{seq, payload})
	if len(p.buf) > p.bufCap {
		p.buf = p.buf[len(p.buf)-p.bufCap:]
	}
	return p.send(seq, payload)
}

// Skip consumes a sequence number without sending it (tests: a lost
// message that replay can still fill).
func (p *Publisher) Skip(b enginekv.Batch) error {
	payload, err := EncodeVLLM(b, p.layout)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, replayEntry{p.seq, payload})
	p.seq++
	return nil
}

func (p *Publisher) send(seq uint64, payload []byte) error {
	if err := p.pub.Send(zmq4.NewMsgFrom(p.topic, binary.BigEndian.AppendUint64(nil, seq), payload)); err != nil {
		return fmt.Errorf("kvevents: publish %d: %w", seq, err)
	}
	return nil
}

func (p *Publisher) serveReplay(ctx context.Context) {
	defer close(p.done)
	for {
		msg, err := p.router.Recv()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				return
			}
			continue
		}
		// [identity, delimiter, start seq]
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		entries := append([]replayEntry(nil), p.buf...)
		p.mu.Unlock()
		for _, e := range entries {
			if e.seq >= start {
				_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, binary.BigEndian.AppendUint64(nil, e.seq), e.payload))
			}
		}
		_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, binary.BigEndian.AppendUint64(nil, enginekv.EndOfReplay), []byte{}))
	}
}

// Close stops the sockets. zmq4 reports a subscriber's connection that
// its peer already closed as an error of the socket's Close; on the way
// down that is no failure, so it is not returned.
func (p *Publisher) Close() error {
	p.cancel()
	err := ignoreClosed(p.pub.Close())
	if p.router != nil {
		if e := ignoreClosed(p.router.Close()); err == nil {
			err = e
		}
	}
	<-p.done
	return err
}

func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
