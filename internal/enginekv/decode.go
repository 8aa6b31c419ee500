package enginekv

import (
	"errors"
	"fmt"
	"math"
)

// Reasons an engine event is skipped (Skip.Reason): a bounded set, fit for
// a metric label.
const (
	// SkipBatch: the whole message is unreadable (not msgpack, not a
	// KVEventBatch).
	SkipBatch = "malformed_batch"
	// SkipUnknownEvent: an event of a type the decoder does not know.
	SkipUnknownEvent = "unknown_event"
	// SkipMalformedEvent: an event of a known type whose fields do not
	// decode (a wrong type, a value out of range).
	SkipMalformedEvent = "malformed_event"
)

// Skip is one event the decoder left out of a batch, or (Index -1) the
// whole batch.
type Skip struct {
	Index  int
	Reason string // SkipBatch, SkipUnknownEvent or SkipMalformedEvent
	Err    string
}

// SkippedBatch is the Batch standing for a message that did not decode:
// no events, one Skip. The stream goes on past it: its sequence number is
// taken, and nothing is reset for it.
func SkippedBatch(err error) Batch {
	return Batch{DPRank: -1, Skipped: []Skip{{Index: -1, Reason: SkipBatch, Err: err.Error()}}}
}

// errUnknownEvent marks an event whose tag the decoder does not know.
type errUnknownEvent struct{ tag string }

func (e errUnknownEvent) Error() string { return fmt.Sprintf("unknown event type %q", e.tag) }

func unknownEvent(tag string) error { return errUnknownEvent{tag} }

// skipReason classifies an event's decode error.
func skipReason(err error) string {
	var u errUnknownEvent
	if errors.As(err, &u) {
		return SkipUnknownEvent
	}
	return SkipMalformedEvent
}

// asTokens reads a stored block's token ids. An entry is a token id, or a
// (token, next token) pair: SGLang's radix cache keys the pages of an EAGLE
// speculative model by bigrams and publishes them as such
// (python/sglang/srt/mem_cache/events.py, _page_tokens); a pair stands for
// the position of its first token.
func asTokens(v any) ([]uint32, error) {
	toks, err := asList(v)
	if err != nil {
		return nil, err
	}
	if len(toks) > maxTokensPerEvent {
		return nil, fmt.Errorf("%d tokens (max %d)", len(toks), maxTokensPerEvent)
	}
	out := make([]uint32, len(toks))
	for i, t := range toks {
		if pair, ok := t.([]any); ok {
			if len(pair) != 2 {
				return nil, fmt.Errorf("[%d]: a token tuple of %d ids (want a bigram)", i, len(pair))
			}
			if _, err := asTokenID(pair[1]); err != nil {
				return nil, fmt.Errorf("[%d][1]: %w", i, err)
			}
			t = pair[0]
		}
		n, err := asTokenID(t)
		if err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		out[i] = n
	}
	return out, nil
}

func asTokenID(v any) (uint32, error) {
	n, err := asInt(v)
	if err != nil || n < 0 || n > math.MaxUint32 {
		return 0, fmt.Errorf("not a token id (%v)", v)
	}
	return uint32(n), nil
}

func asBlockSize(v any) (int, error) {
	bs, err := asInt(v)
	if err != nil || bs <= 0 || bs > 1<<20 {
		return 0, fmt.Errorf("want a positive integer, got %v", v)
	}
	return int(bs), nil
}

func isZero(v any) bool {
	n, err := asInt(v)
	return err == nil && n == 0
}

// maxDepth bounds the nesting of an engine message (a batch, its events,
// their fields and a metadata map are four levels).
const maxDepth = 32

// checkMsgpack walks a msgpack document without decoding it and refuses
// one whose declared lengths exceed the bytes that follow (a forged length
// would make the decoder allocate or loop for it), one nested deeper than
// maxDepth, and one with bytes left over. The decoder is run only on what
// passes.
func checkMsgpack(b []byte) error {
	pending := []uint64{1} // per open container: items still to read
	for len(pending) > 0 {
		if pending[len(pending)-1] == 0 {
			pending = pending[:len(pending)-1]
			continue
		}
		pending[len(pending)-1]--
		if len(b) == 0 {
			return errors.New("msgpack: truncated")
		}
		skip, items, err := msgpackItem(b)
		if err != nil {
			return err
		}
		if uint64(len(b)) < skip {
			return errors.New("msgpack: truncated")
		}
		b = b[skip:]
		if items > 0 {
			if items > uint64(len(b)) {
				return fmt.Errorf("msgpack: a container of %d items in %d bytes", items, len(b))
			}
			if len(pending) >= maxDepth {
				return fmt.Errorf("msgpack: nested deeper than %d", maxDepth)
			}
			pending = append(pending, items)
		}
	}
	if len(b) != 0 {
		return fmt.Errorf("msgpack: %d bytes after the document", len(b))
	}
	return nil
}

// msgpackItem reads the header of the item at b[0]: the bytes to skip to
// its contents' end (a scalar) or its first element (a container), and a
// container's element count (a map's keys and values).
func msgpackItem(b []byte) (skip, items uint64, err error) {
	c := b[0]
	length := func(n int) (uint64, error) {
		if len(b) < 1+n {
			return 0, errors.New("msgpack: truncated")
		}
		var v uint64
		for _, x := range b[1 : 1+n] {
			v = v<<8 | uint64(x)
		}
		return v, nil
	}
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		return 1, 0, nil
	case c >= 0x80 && c <= 0x8f:
		return 1, 2 * uint64(c&0x0f), nil
	case c >= 0x90 && c <= 0x9f:
		return 1, uint64(c & 0x0f), nil
	case c >= 0xa0 && c <= 0xbf:
		return 1 + uint64(c&0x1f), 0, nil
	}
	if n, ok := msgpackFixed[c]; ok {
		return 1 + n, 0, nil
	}
	s, ok := msgpackSized[c]
	if !ok {
		return 0, 0, fmt.Errorf("msgpack: invalid code 0x%02x", c)
	}
	n, err := length(s.width)
	if err != nil {
		return 0, 0, err
	}
	head := 1 + uint64(s.width) + s.extra
	if s.count == 0 {
		return head + n, 0, nil
	}
	return head, n * s.count, nil
}

// msgpackFixed: codes followed by a fixed number of bytes.
var msgpackFixed = map[byte]uint64{0xca: 4, 0xcb: 8, 0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8, 0xd0: 1, 0xd1: 2, 0xd2: 4, 0xd3: 8,
	0xd4: 2, 0xd5: 3, 0xd6: 5, 0xd7: 9, 0xd8: 17}

// msgpackSized: codes followed by a length of width bytes (then an ext's
// type byte), and what the length counts.
var msgpackSized = map[byte]struct {
	width int
	extra uint64 // an ext's type byte
	count uint64 // 0: bytes follow; 1: array items; 2: map pairs
}{0xc4: {1, 0, 0}, 0xc5: {2, 0, 0}, 0xc6: {4, 0, 0}, 0xd9: {1, 0, 0}, 0xda: {2, 0, 0}, 0xdb: {4, 0, 0},
	0xc7: {1, 1, 0}, 0xc8: {2, 1, 0}, 0xc9: {4, 1, 0}, 0xdc: {2, 0, 1}, 0xdd: {4, 0, 1}, 0xde: {2, 0, 2}, 0xdf: {4, 0, 2}}
