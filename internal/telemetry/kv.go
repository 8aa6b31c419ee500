package telemetry

import (
	"encoding/binary"
	"fmt"

	"github.com/tether-project/tether/internal/binread"
)

// KVEvent is one change to one rank's prefix cache: Removed blocks are
// applied before Stored blocks. Hashes are internal/prefix chained block
// hashes (never 0).
type KVEvent struct {
	Rank    int
	Removed []uint64
	Stored  []uint64
}

// KVEventBatch is the events a worker collected during one interval, in the
// order they happened. Seq increases by exactly 1 per batch within a boot, so
// a receiver that sees Seq jump (or a load report's KVSeq ahead of what it
// applied) has missed events and requests a KV dump; a new BootID means the
// worker restarted with empty caches.
type KVEventBatch struct {
	Instance string
	BootID   uint64
	Seq      uint64
	Events   []KVEvent
}

// KVDump is (one part of) a worker's full cache contents, the reply to a
// request on KVDumpSubject. It reflects every KV event batch with sequence
// <= Seq and none after, so the receiver applies only batches with a larger
// sequence on top. Large dumps arrive as Parts messages (Part 0..Parts-1) on
// the reply subject; a rank's blocks may span parts.
type KVDump struct {
	Instance string
	BootID   uint64
	Seq      uint64
	Part     int
	Parts    int
	Ranks    []RankBlocks
}

// RankBlocks lists blocks a rank holds.
type RankBlocks struct {
	Rank   int
	Blocks []uint64
}

// Binary layout (all integers big-endian or unsigned varints):
//
//	magic "TK", version byte (1), type byte (1 events, 2 dump)
//	uvarint len, instance id bytes
//	uint64 boot id, uint64 seq
//	events: uvarint count; per event: uvarint rank,
//	        uvarint n, n×uint64 removed, uvarint m, m×uint64 stored
//	dump:   uvarint part, uvarint parts, uvarint count;
//	        per rank: uvarint rank, uvarint n, n×uint64 blocks
const (
	kvMagic0, kvMagic1 = 'T', 'K'
	kvTypeEvents       = 1
	kvTypeDump         = 2
	kvHeaderFixed      = 4 + 8 + 8
)

// AppendKVEvents validates b and appends its binary encoding to dst.
func AppendKVEvents(dst []byte, b KVEventBatch) ([]byte, error) {
	subject := KVSubject(b.Instance)
	if err := checkKVHeader(subject, b.Instance, b.BootID, b.Seq); err != nil {
		return nil, err
	}
	if len(b.Events) > MaxEventsPerBatch {
		return nil, decodeErr(ErrOutOfRange, subject, "events", "%d events (max %d)", len(b.Events), MaxEventsPerBatch)
	}
	total := 0
	for i, ev := range b.Events {
		if ev.Rank < 0 || ev.Rank >= MaxRanks {
			return nil, decodeErr(ErrOutOfRange, subject, fmt.Sprintf("events[%d].rank", i), "%d (want 0..%d)", ev.Rank, MaxRanks-1)
		}
		total += len(ev.Removed) + len(ev.Stored)
		for _, h := range ev.Removed {
			if h == 0 {
				return nil, decodeErr(ErrOutOfRange, subject, fmt.Sprintf("events[%d].removed", i), "zero hash")
			}
		}
		for _, h := range ev.Stored {
			if h == 0 {
				return nil, decodeErr(ErrOutOfRange, subject, fmt.Sprintf("events[%d].stored", i), "zero hash")
			}
		}
	}
	if total > MaxHashesPerMessage {
		return nil, decodeErr(ErrOutOfRange, subject, "events", "%d hashes (max %d)", total, MaxHashesPerMessage)
	}
	dst = appendKVHeader(dst, kvTypeEvents, b.Instance, b.BootID, b.Seq)
	dst = binary.AppendUvarint(dst, uint64(len(b.Events)))
	for _, ev := range b.Events {
		dst = binary.AppendUvarint(dst, uint64(ev.Rank))
		dst = appendHashes(dst, ev.Removed)
		dst = appendHashes(dst, ev.Stored)
	}
	return dst, nil
}

// KVEventsSize is the encoded size of b in bytes (an upper bound within 10
// bytes per varint), for splitting batches under the NATS payload limit.
func KVEventsSize(b KVEventBatch) int {
	n := kvHeaderFixed + binary.MaxVarintLen64 + len(b.Instance) + binary.MaxVarintLen64
	for _, ev := range b.Events {
		n += 3*binary.MaxVarintLen64 + 8*(len(ev.Removed)+len(ev.Stored))
	}
	return n
}

// SplitKVEvents splits events into consecutive groups of at most maxHashes
// hashes each, preserving order (an oversized event is cut into several
// events; its removals still precede its stores). maxHashes < 1 means 1.
func SplitKVEvents(events []KVEvent, maxHashes int) [][]KVEvent {
	if maxHashes < 1 {
		maxHashes = 1
	}
	var out [][]KVEvent
	var cur []KVEvent
	room := maxHashes
	flush := func() {
		if len(cur) > 0 {
			out = append(out, cur)
		}
		cur, room = nil, maxHashes
	}
	for _, ev := range events {
		if len(ev.Removed)+len(ev.Stored) == 0 {
			continue
		}
		removed, stored := ev.Removed, ev.Stored
		for len(removed)+len(stored) > 0 {
			if room == 0 {
				flush()
			}
			piece := KVEvent{Rank: ev.Rank}
			take := min(room, len(removed))
			piece.Removed, removed = removed[:take:take], removed[take:]
			room -= take
			if len(removed) == 0 {
				take = min(room, len(stored))
				piece.Stored, stored = stored[:take:take], stored[take:]
				room -= take
			}
			cur = append(cur, piece)
		}
	}
	flush()
	return out
}

// DecodeKVEvents decodes and validates a KV event batch received on subject.
func DecodeKVEvents(subject string, data []byte) (KVEventBatch, error) {
	s, err := expectSubject(subject, SubjectKV)
	if err != nil {
		return KVEventBatch{}, err
	}
	r := newKVReader(subject, data)
	var b KVEventBatch
	if b.Instance, b.BootID, b.Seq, err = r.header(kvTypeEvents); err != nil {
		return KVEventBatch{}, err
	}
	if b.Instance != s.Instance {
		return KVEventBatch{}, decodeErr(ErrSubjectMismatch, subject, "instance", "payload %q, subject %q", b.Instance, s.Instance)
	}
	n, err := r.count("events", MaxEventsPerBatch, 3) // an event takes at least 3 bytes
	if err != nil {
		return KVEventBatch{}, err
	}
	b.Events = make([]KVEvent, n)
	total := 0
	for i := range b.Events {
		ev := &b.Events[i]
		rank, err := r.count(fmt.Sprintf("events[%d].rank", i), MaxRanks-1, 0)
		if err != nil {
			return KVEventBatch{}, err
		}
		ev.Rank = rank
		if ev.Removed, err = r.hashes(fmt.Sprintf("events[%d].removed", i), &total); err != nil {
			return KVEventBatch{}, err
		}
		if ev.Stored, err = r.hashes(fmt.Sprintf("events[%d].stored", i), &total); err != nil {
			return KVEventBatch{}, err
		}
	}
	if err := r.end(); err != nil {
		return KVEventBatch{}, err
	}
	return b, nil
}

// EncodeKVDump validates d and encodes it.
func EncodeKVDump(d KVDump) ([]byte, error) {
	subject := KVDumpSubject(d.Instance)
	if err := checkKVHeader(subject, d.Instance, d.BootID, d.Seq); err != nil {
		return nil, err
	}
	if d.Parts < 1 || d.Parts > MaxDumpParts || d.Part < 0 || d.Part >= d.Parts {
		return nil, decodeErr(ErrOutOfRange, subject, "part", "part %d of %d (want 0 <= part < parts <= %d)", d.Part, d.Parts, MaxDumpParts)
	}
	total, prev := 0, -1
	for i, rb := range d.Ranks {
		if rb.Rank <= prev || rb.Rank >= MaxRanks {
			return nil, decodeErr(ErrOutOfRange, subject, fmt.Sprintf("ranks[%d].rank", i), "%d (ranks strictly ascending, < %d)", rb.Rank, MaxRanks)
		}
		prev = rb.Rank
		total += len(rb.Blocks)
		for _, h := range rb.Blocks {
			if h == 0 {
				return nil, decodeErr(ErrOutOfRange, subject, fmt.Sprintf("ranks[%d].blocks", i), "zero hash")
			}
		}
	}
	if total > MaxHashesPerMessage {
		return nil, decodeErr(ErrOutOfRange, subject, "ranks", "%d hashes (max %d)", total, MaxHashesPerMessage)
	}
	dst := appendKVHeader(make([]byte, 0, kvHeaderFixed+len(d.Instance)+8*total+16*len(d.Ranks)+16), kvTypeDump, d.Instance, d.BootID, d.Seq)
	dst = binary.AppendUvarint(dst, uint64(d.Part))
	dst = binary.AppendUvarint(dst, uint64(d.Parts))
	dst = binary.AppendUvarint(dst, uint64(len(d.Ranks)))
	for _, rb := range d.Ranks {
		dst = binary.AppendUvarint(dst, uint64(rb.Rank))
		dst = appendHashes(dst, rb.Blocks)
	}
	return dst, nil
}

// SplitKVDump cuts a full dump (ranks ascending) into parts of at most
// maxHashes blocks each, numbering them. An empty dump is one empty part.
func SplitKVDump(d KVDump, maxHashes int) []KVDump {
	if maxHashes < 1 {
		maxHashes = 1
	}
	var parts []KVDump
	cur := KVDump{Instance: d.Instance, BootID: d.BootID, Seq: d.Seq}
	room := maxHashes
	for _, rb := range d.Ranks {
		blocks := rb.Blocks
		for len(blocks) > 0 {
			if room == 0 {
				parts = append(parts, cur)
				cur = KVDump{Instance: d.Instance, BootID: d.BootID, Seq: d.Seq}
				room = maxHashes
			}
			take := min(room, len(blocks))
			cur.Ranks = append(cur.Ranks, RankBlocks{Rank: rb.Rank, Blocks: blocks[:take:take]})
			blocks, room = blocks[take:], room-take
		}
	}
	parts = append(parts, cur)
	for i := range parts {
		parts[i].Part, parts[i].Parts = i, len(parts)
	}
	return parts
}

// DecodeKVDump decodes and validates one dump part, replied to a request
// sent on subject (KVDumpSubject of the instance asked).
func DecodeKVDump(subject string, data []byte) (KVDump, error) {
	s, err := expectSubject(subject, SubjectKVDump)
	if err != nil {
		return KVDump{}, err
	}
	r := newKVReader(subject, data)
	var d KVDump
	if d.Instance, d.BootID, d.Seq, err = r.header(kvTypeDump); err != nil {
		return KVDump{}, err
	}
	if d.Instance != s.Instance {
		return KVDump{}, decodeErr(ErrSubjectMismatch, subject, "instance", "payload %q, subject %q", d.Instance, s.Instance)
	}
	if d.Part, err = r.count("part", MaxDumpParts-1, 0); err != nil {
		return KVDump{}, err
	}
	if d.Parts, err = r.count("parts", MaxDumpParts, 0); err != nil {
		return KVDump{}, err
	}
	if d.Parts < 1 || d.Part >= d.Parts {
		return KVDump{}, decodeErr(ErrOutOfRange, subject, "part", "part %d of %d", d.Part, d.Parts)
	}
	n, err := r.count("ranks", MaxRanks, 2)
	if err != nil {
		return KVDump{}, err
	}
	d.Ranks = make([]RankBlocks, n)
	total, prev := 0, -1
	for i := range d.Ranks {
		rank, err := r.count(fmt.Sprintf("ranks[%d].rank", i), MaxRanks-1, 0)
		if err != nil {
			return KVDump{}, err
		}
		if rank <= prev {
			return KVDump{}, decodeErr(ErrOutOfRange, subject, fmt.Sprintf("ranks[%d].rank", i), "%d after %d (want strictly ascending)", rank, prev)
		}
		prev = rank
		d.Ranks[i].Rank = rank
		if d.Ranks[i].Blocks, err = r.hashes(fmt.Sprintf("ranks[%d].blocks", i), &total); err != nil {
			return KVDump{}, err
		}
	}
	if err := r.end(); err != nil {
		return KVDump{}, err
	}
	return d, nil
}

func checkKVHeader(subject, instance string, bootID, seq uint64) error {
	if err := ValidInstanceID(instance); err != nil {
		return decodeErr(ErrOutOfRange, subject, "instance", "%v", err)
	}
	if bootID == 0 {
		return decodeErr(ErrOutOfRange, subject, "boot_id", "zero")
	}
	_ = seq // 0 is valid for a dump taken before any batch
	return nil
}

func appendKVHeader(dst []byte, typ byte, instance string, bootID, seq uint64) []byte {
	dst = append(dst, kvMagic0, kvMagic1, Version, typ)
	dst = binary.AppendUvarint(dst, uint64(len(instance)))
	dst = append(dst, instance...)
	dst = binary.BigEndian.AppendUint64(dst, bootID)
	return binary.BigEndian.AppendUint64(dst, seq)
}

func appendHashes(dst []byte, hs []uint64) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(hs)))
	for _, h := range hs {
		dst = binary.BigEndian.AppendUint64(dst, h)
	}
	return dst
}

// kvReader decodes the binary layout over the shared reader
// (internal/binread), checking every length against the bytes actually
// present before allocating; a failure of the reader is ErrMalformed, a
// value beyond its limit ErrOutOfRange.
type kvReader struct {
	subject string
	r       binread.Reader
}

func newKVReader(subject string, data []byte) *kvReader {
	return &kvReader{subject: subject, r: binread.Reader{Buf: data}}
}

func (k *kvReader) fail(kind error, field, format string, args ...any) error {
	return decodeErr(kind, k.subject, field, format, args...)
}

// malformed is the reader's failure.
func (k *kvReader) malformed() error {
	return k.fail(ErrMalformed, k.r.Err.Field, "%s", k.r.Err.Msg)
}

func (k *kvReader) header(wantType byte) (instance string, bootID, seq uint64, err error) {
	h := k.r.Bytes(4, "header")
	if h == nil || h[0] != kvMagic0 || h[1] != kvMagic1 {
		return "", 0, 0, k.fail(ErrMalformed, "", "not a tether KV message (bad magic)")
	}
	if h[2] != Version {
		return "", 0, 0, k.fail(ErrUnknownVersion, "version", "%d (this build understands %d)", h[2], Version)
	}
	if h[3] != wantType {
		return "", 0, 0, k.fail(ErrMalformed, "type", "message type %d, want %d", h[3], wantType)
	}
	n, err := k.count("instance", MaxInstanceIDLen, 1)
	if err != nil {
		return "", 0, 0, err
	}
	instance = string(k.r.Bytes(n, "instance"))
	if err := ValidInstanceID(instance); err != nil {
		return "", 0, 0, k.fail(ErrOutOfRange, "instance", "%v", err)
	}
	bootID, seq = k.r.Uint64BE("boot_id"), k.r.Uint64BE("seq")
	if k.r.Failed() {
		return "", 0, 0, k.malformed()
	}
	if bootID == 0 {
		return "", 0, 0, k.fail(ErrOutOfRange, "boot_id", "zero")
	}
	return instance, bootID, seq, nil
}

// count reads a uvarint no larger than max, and checks that count items of
// at least minItemBytes each (0: not a count of items) could fit in the
// remaining input.
func (k *kvReader) count(field string, max int, minItemBytes int) (int, error) {
	v := k.r.Uvarint(field)
	if k.r.Failed() {
		return 0, k.malformed()
	}
	if v > uint64(max) {
		return 0, k.fail(ErrOutOfRange, field, "%d (max %d)", v, max)
	}
	if minItemBytes > 0 && v > uint64(k.r.Remaining()/minItemBytes) {
		return 0, k.fail(ErrMalformed, field, "%d items but only %d bytes left", v, k.r.Remaining())
	}
	return int(v), nil
}

func (k *kvReader) hashes(field string, total *int) ([]uint64, error) {
	n, err := k.count(field, MaxHashesPerMessage, 8)
	if err != nil {
		return nil, err
	}
	*total += n
	if *total > MaxHashesPerMessage {
		return nil, k.fail(ErrOutOfRange, field, "more than %d hashes in one message", MaxHashesPerMessage)
	}
	if n == 0 {
		return nil, nil
	}
	out := make([]uint64, n)
	for i := range out {
		if out[i] = k.r.Uint64BE(field); out[i] == 0 {
			return nil, k.fail(ErrOutOfRange, fmt.Sprintf("%s[%d]", field, i), "zero hash")
		}
	}
	return out, nil
}

func (k *kvReader) end() error {
	if n := k.r.Remaining(); n != 0 {
		return k.fail(ErrMalformed, "", "%d trailing bytes", n)
	}
	return nil
}
