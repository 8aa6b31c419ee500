package enginekv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
// "window_size": n, "attention_dp_rank": n?}, …]. It returns one TRTEvent
// per element, in order, so the caller can check continuity per rank. An
// element that does not decode is returned with Skip set (and its id when
// that much was readable): the others are kept. An error means the answer
// is not a JSON array at all.
func DecodeTRTLLM(body []byte) ([]TRTEvent, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, fmt.Errorf("enginekv: trtllm events: %w", err)
	}
	out := make([]TRTEvent, 0, len(raw))
	for i, r := range raw {
		te, err := decodeTRTEvent(r)
		if err != nil {
			te.Skip = &Skip{Index: i, Reason: skipReason(err), Err: fmt.Sprintf("events[%d]: %v", i, err)}
		}
		out = append(out, te)
	}
	return out, nil
}

// decodeTRTEvent decodes one element; on error the returned TRTEvent still
// carries the id (HasID) and rank when they were readable.
func decodeTRTEvent(r json.RawMessage) (TRTEvent, error) {
	te := TRTEvent{DPRank: -1}
	dec := json.NewDecoder(bytes.NewReader(r))
	dec.UseNumber() // block hashes are 64-bit: float64 would round them
	var ev struct {
		EventID json.Number     `json:"event_id"`
		Data    json.RawMessage `json:"data"`
		Window  *json.Number    `json:"window_size"`
		DPRank  *json.Number    `json:"attention_dp_rank"`
	}
	if err := dec.Decode(&ev); err != nil {
		return te, err
	}
	id, err := strconv.ParseUint(ev.EventID.String(), 10, 64)
	if err != nil {
		return te, fmt.Errorf("event_id: %w", err)
	}
	te.ID, te.HasID = id, true
	if ev.DPRank != nil {
		n, err := strconv.Atoi(ev.DPRank.String())
		if err != nil || n < 0 || n > 1<<16 {
			return te, fmt.Errorf("attention_dp_rank: %q", ev.DPRank.String())
		}
		te.DPRank = n
	}
	if te.Events, te.Created, err = decodeTRTData(ev.Data); err != nil {
		return te, fmt.Errorf("(id %d) %w", id, err)
	}
	if ev.Window != nil {
		w, err := strconv.ParseInt(ev.Window.String(), 10, 64)
		if err != nil || w < 0 || w > 1<<40 {
			return te, fmt.Errorf("window_size: %q", ev.Window.String())
		}
		for i := range te.Events {
			te.Events[i].Window = int(w)
		}
	}
	return te, nil
}

// TRTEvent is one TensorRT-LLM event as engine-neutral events: created (a
// new KV cache) resets the rank; stored and removed are one event each; an
// updated event moving a block between cache levels is a store in the
// level it reached and a removal from the one it left (TRTLevelMedium), and
// one changing only its priority is none.
type TRTEvent struct {
	ID      uint64
	HasID   bool // false: the element was unreadable before its event_id
	DPRank  int
	Created bool
	Events  []Event
	// Skip is set when the element did not decode (Events empty).
	Skip *Skip
}

// TRTLevelMedium is the Event.Medium of a block in TensorRT-LLM's cache
// level n: level 0 is the GPU (primary) pool (""), level 1 the secondary
// pool in host memory that block offloading fills
// (kv_cache_config.host_cache_size).
func TRTLevelMedium(level int64) string {
	if level <= 0 {
		return ""
	}
	if level == 1 {
		return "host"
	}
	return "level" + strconv.FormatInt(level, 10)
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

// trtBlock is one block of a stored event.
type trtBlock struct {
	BlockHash json.Number `json:"block_hash"`
	Tokens    []struct {
		TokenID      json.Number `json:"token_id"`
		TokenExtraID json.Number `json:"token_extra_id"`
	} `json:"tokens"`
	LoraID     *json.Number `json:"lora_id"`
	CacheLevel *json.Number `json:"cache_level"`
}

func decodeTRTData(data json.RawMessage) ([]Event, bool, error) {
	var d struct {
		Type        string        `json:"type"`
		ParentHash  *json.Number  `json:"parent_hash"`
		BlockHashes []json.Number `json:"block_hashes"`
		BlockHash   *json.Number  `json:"block_hash"`
		CacheLevel  *struct {
			New *json.Number `json:"new_value"`
			Old *json.Number `json:"old_value"`
		} `json:"cache_level"`
		Blocks []trtBlock `json:"blocks"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&d); err != nil {
		return nil, false, fmt.Errorf("data: %w", err)
	}
	switch d.Type {
	case "created":
		return []Event{{Kind: Cleared}}, true, nil
	case "updated":
		return decodeTRTUpdated(d.BlockHash, d.CacheLevel)
	case "removed":
		// A removed block left the cache, whichever level held it.
		ev := Event{Kind: Removed}
		for j, n := range d.BlockHashes {
			h, err := parseTRTHash(n)
			if err != nil {
				return nil, false, fmt.Errorf("block_hashes[%d]: %w", j, err)
			}
			ev.Hashes = append(ev.Hashes, h)
		}
		host := ev
		host.Medium = TRTLevelMedium(1)
		return []Event{ev, host}, false, nil
	case "stored":
		ev, err := decodeTRTStored(d.ParentHash, d.Blocks)
		if err != nil {
			return nil, false, err
		}
		return []Event{ev}, false, nil
	}
	return nil, false, unknownEvent(d.Type)
}

// decodeTRTStored reads a stored event (KVCacheStoredData: parent_hash and
// blocks): the blocks' hashes and tokens, the block size (the first
// block's; -1 for uneven blocks), the medium (the first block's cache
// level), and whether a block is not plain text of the base model (a LoRA
// id, multimodal or prompt-table tokens).
func decodeTRTStored(parent *json.Number, blocks []trtBlock) (Event, error) {
	ev := Event{Kind: Stored}
	if parent != nil {
		h, err := parseTRTHash(*parent)
		if err != nil {
			return ev, fmt.Errorf("parent_hash: %w", err)
		}
		ev.Parent, ev.HasParent = h, true
	}
	for j, b := range blocks {
		h, err := parseTRTHash(b.BlockHash)
		if err != nil {
			return ev, fmt.Errorf("blocks[%d].block_hash: %w", j, err)
		}
		if j == 0 {
			ev.BlockSize = len(b.Tokens)
			if b.CacheLevel != nil {
				level, err := b.CacheLevel.Int64()
				if err != nil {
					return ev, fmt.Errorf("blocks[%d].cache_level: %w", j, err)
				}
				ev.Medium = TRTLevelMedium(level)
			}
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
				return ev, fmt.Errorf("blocks[%d].tokens[%d].token_id: %w", j, k, err)
			}
			if x := t.TokenExtraID.String(); x != "" && x != "0" {
				ev.Foreign = true // multimodal / prompt-table tokens
			}
			ev.Tokens = append(ev.Tokens, uint32(id))
		}
	}
	return ev, nil
}

// decodeTRTUpdated reads an updated event (KVCacheUpdatedData: block_hash,
// cache_level and priority as event_diff {new_value, old_value}): a block
// that changed cache level is stored in the new level, by its hash (its
// key is the one it had in the old), then removed from the old. A priority
// change alone changes nothing tether tracks.
func decodeTRTUpdated(hash *json.Number, level *struct {
	New *json.Number `json:"new_value"`
	Old *json.Number `json:"old_value"`
}) ([]Event, bool, error) {
	if level == nil || level.New == nil || level.Old == nil {
		return nil, false, nil
	}
	to, err1 := level.New.Int64()
	from, err2 := level.Old.Int64()
	if err1 != nil || err2 != nil {
		return nil, false, fmt.Errorf("cache_level: want integer new_value and old_value")
	}
	if to == from {
		return nil, false, nil
	}
	if hash == nil {
		return nil, false, errors.New("updated event without block_hash")
	}
	h, err := parseTRTHash(*hash)
	if err != nil {
		return nil, false, fmt.Errorf("block_hash: %w", err)
	}
	return []Event{
		{Kind: Stored, Hashes: []Hash{h}, Medium: TRTLevelMedium(to)},
		{Kind: Removed, Hashes: []Hash{h}, Medium: TRTLevelMedium(from)},
	}, false, nil
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

// deliver hands one answer's events to h in order. Continuity is checked
// per rank on event ids; an element that did not decode is a batch of no
// events that says so (its id, when readable, keeps the sequence; an
// unreadable one may account for one missing id of the answer), never a
// reset.
func (p *Poller) deliver(evs []TRTEvent, next map[int]uint64, h Handler) {
	unread := 0 // elements of this answer whose id could not be read
	for _, te := range evs {
		if te.Skip != nil && !te.HasID {
			unread++
			h.Batch(0, Batch{DPRank: te.DPRank, Skipped: []Skip{*te.Skip}})
			continue
		}
		dp := max(te.DPRank, 0) // absent without attention DP
		if want, ok := next[dp]; ok && te.ID != want && !te.Created {
			if te.ID > want && te.ID-want <= uint64(unread) {
				unread -= int(te.ID - want)
			} else {
				h.Reset(fmt.Sprintf("trtllm event id %d, want %d", te.ID, want))
			}
		}
		next[dp] = te.ID + 1
		b := Batch{DPRank: te.DPRank, Events: te.Events}
		if te.Skip != nil {
			b.Skipped = []Skip{*te.Skip}
		}
		if len(b.Events)+len(b.Skipped) > 0 {
			h.Batch(te.ID, b)
		}
	}
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
			p.deliver(evs, next, h)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
