package enginekv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DecodeTRTLLM decodes the JSON array trtllm-serve answers on
// POST /kv_cache_events (tensorrt_llm/_utils.py KVCacheEventSerializer):
// [{"event_id": n, "data": {"type": "created"|"stored"|"removed"|"updated", …},
// "window_size": n, "attention_dp_rank": n?}, …]. It returns one Batch per
// event with the event id, so the caller can check continuity per rank.
func DecodeTRTLLM(body []byte) ([]TRTEvent, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // block hashes are 64-bit: float64 would round them
	var raw []struct {
		EventID json.Number     `json:"event_id"`
		Data    json.RawMessage `json:"data"`
		Window  *json.Number    `json:"window_size"`
		DPRank  *json.Number    `json:"attention_dp_rank"`
	}
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("enginekv: trtllm events: %w", err)
	}
	out := make([]TRTEvent, 0, len(raw))
	for i, r := range raw {
		id, err := strconv.ParseUint(r.EventID.String(), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("enginekv: trtllm events[%d].event_id: %w", i, err)
		}
		te := TRTEvent{ID: id, DPRank: -1}
		if r.DPRank != nil {
			n, err := strconv.Atoi(r.DPRank.String())
			if err != nil || n < 0 || n > 1<<16 {
				return nil, fmt.Errorf("enginekv: trtllm events[%d].attention_dp_rank: %q", i, r.DPRank.String())
			}
			te.DPRank = n
		}
		if te.Event, te.Created, err = decodeTRTData(r.Data); err != nil {
			return nil, fmt.Errorf("enginekv: trtllm events[%d] (id %d): %w", i, id, err)
		}
		if r.Window != nil {
			w, err := strconv.ParseInt(r.Window.String(), 10, 64)
			if err != nil || w < 0 || w > 1<<40 {
				return nil, fmt.Errorf("enginekv: trtllm events[%d].window_size: %q", i, r.Window.String())
			}
			te.Event.Window = int(w)
		}
		out = append(out, te)
	}
	return out, nil
}

// TRTEvent is one TensorRT-LLM event. Created events (a new KV cache)
// reset the rank; updated events (priority, cache level) change nothing
// tether tracks and come back with Event.Kind 0.
type TRTEvent struct {
	ID      uint64
	DPRank  int
	Created bool
	Event   Event
}

func parseTRTHash(n json.Number) (Hash, error) {
	s := n.String()
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return IntHash(u), nil
	}
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		return IntHash(uint64(v)), nil
	}
	return "", fmt.Errorf("block hash %q is not a 64-bit integer", s)
}

func decodeTRTData(data json.RawMessage) (Event, bool, error) {
	var d struct {
		Type        string        `json:"type"`
		ParentHash  *json.Number  `json:"parent_hash"`
		BlockHashes []json.Number `json:"block_hashes"`
		Blocks      []struct {
			BlockHash json.Number `json:"block_hash"`
			Tokens    []struct {
				TokenID      json.Number `json:"token_id"`
				TokenExtraID json.Number `json:"token_extra_id"`
			} `json:"tokens"`
			LoraID *json.Number `json:"lora_id"`
		} `json:"blocks"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&d); err != nil {
		return Event{}, false, fmt.Errorf("data: %w", err)
	}
	switch d.Type {
	case "created":
		return Event{Kind: Cleared}, true, nil
	case "updated":
		return Event{}, false, nil
	case "removed":
		ev := Event{Kind: Removed}
		for j, n := range d.BlockHashes {
			h, err := parseTRTHash(n)
			if err != nil {
				return Event{}, false, fmt.Errorf("block_hashes[%d]: %w", j, err)
			}
			ev.Hashes = append(ev.Hashes, h)
		}
		return ev, false, nil
	case "stored":
		ev := Event{Kind: Stored}
		if d.ParentHash != nil {
			h, err := parseTRTHash(*d.ParentHash)
			if err != nil {
				return Event{}, false, fmt.Errorf("parent_hash: %w", err)
			}
			ev.Parent, ev.HasParent = h, true
		}
		for j, b := range d.Blocks {
			h, err := parseTRTHash(b.BlockHash)
			if err != nil {
				return Event{}, false, fmt.Errorf("blocks[%d].block_hash: %w", j, err)
			}
			if j == 0 {
				ev.BlockSize = len(b.Tokens)
			} else if len(b.Tokens) != ev.BlockSize {
				ev.BlockSize = -1 // uneven blocks: Mapper counts them malformed
			}
			ev.Hashes = append(ev.Hashes, h)
			if b.LoraID != nil && b.LoraID.String() != "0" {
				ev.Foreign = true
			}
			for k, t := range b.Tokens {
				id, err := strconv.ParseUint(t.TokenID.String(), 10, 32)
				if err != nil {
					return Event{}, false, fmt.Errorf("blocks[%d].tokens[%d].token_id: %w", j, k, err)
				}
				if x := t.TokenExtraID.String(); x != "" && x != "0" {
					ev.Foreign = true // multimodal / prompt-table tokens
				}
				ev.Tokens = append(ev.Tokens, uint32(id))
			}
		}
		return ev, false, nil
	}
	return Event{}, false, fmt.Errorf("unknown event type %q", d.Type)
}

// PollerConfig configures a Poller.
type PollerConfig struct {
	// URL is trtllm-serve's base URL; events are drained from
	// URL + "/kv_cache_events".
	URL string
	// Interval between polls (default 200 ms).
	Interval time.Duration
	// Timeout bounds one poll (default 5 s).
	Timeout time.Duration
	// MaxBodyBytes bounds one answer (default MaxPayloadBytes).
	MaxBodyBytes int64
	Client       *http.Client
	Log          *slog.Logger
}

// Poller drains a trtllm-serve's KV cache events. The endpoint hands each
// event out once, so a lost answer is a gap: event ids are checked per
// attention-DP rank and a jump resets the rank.
type Poller struct {
	cfg    PollerConfig
	url    string
	client *http.Client
	log    *slog.Logger
}

// NewPoller validates cfg.
func NewPoller(cfg PollerConfig) (*Poller, error) {
	if !strings.HasPrefix(cfg.URL, "http://") && !strings.HasPrefix(cfg.URL, "https://") {
		return nil, fmt.Errorf("enginekv: poller URL %q is not an absolute http(s) URL", cfg.URL)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 200 * time.Millisecond
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = MaxPayloadBytes
	}
	p := &Poller{cfg: cfg, url: strings.TrimRight(cfg.URL, "/") + "/kv_cache_events", client: cfg.Client, log: cfg.Log}
	if p.client == nil {
		p.client = &http.Client{Timeout: cfg.Timeout}
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	return p, nil
}

// Poll fetches and decodes one answer.
func (p *Poller) Poll(ctx context.Context) ([]TRTEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, nil)
	if err != nil {
		return nil, fmt.Errorf("enginekv: %w", err)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("enginekv: poll %s: %w", p.url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, p.cfg.MaxBodyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("enginekv: poll %s: %w", p.url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("enginekv: poll %s: HTTP %d", p.url, resp.StatusCode)
	}
	if int64(len(body)) > p.cfg.MaxBodyBytes {
		return nil, fmt.Errorf("enginekv: poll %s: answer over %d bytes", p.url, p.cfg.MaxBodyBytes)
	}
	if len(bytes.TrimSpace(body)) == 0 || string(bytes.TrimSpace(body)) == "null" {
		return nil, nil
	}
	return DecodeTRTLLM(body)
}

// Run polls until ctx is done, delivering events as one-event batches
// (sequence = event id) with the attention-DP rank, and Reset on a created
// event or an id gap.
func (p *Poller) Run(ctx context.Context, h Handler) error {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	next := map[int]uint64{} // per DP rank: the event id expected next
	failing := false
	for {
		evs, err := p.Poll(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			if !failing {
				p.log.Warn("kv events poll failed", "err", err)
			}
			failing = true
		default:
			failing = false
			for _, te := range evs {
				dp := max(te.DPRank, 0) // absent without attention DP
				if want, ok := next[dp]; ok && te.ID != want && !te.Created {
					h.Reset(fmt.Sprintf("trtllm event id %d, want %d", te.ID, want))
				}
				next[dp] = te.ID + 1
				if te.Event.Kind == 0 {
					continue
				}
				h.Batch(te.ID, Batch{DPRank: te.DPRank, Events: []Event{te.Event}})
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
