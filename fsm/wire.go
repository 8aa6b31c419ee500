package fsm

import (
	"encoding/binary"
	"fmt"
	"math"
)

// MaxFieldBytes bounds every string field of an encoded event. Routing keys,
// ids and URLs are far shorter; the bound keeps a corrupt length prefix from
// asking the decoder for gigabytes.
const MaxFieldBytes = 64 << 10

// The wire primitives shared by the event, entry, result and snapshot codecs.
// Integers are unsigned LEB128 varints (signed ones zig-zag encoded), strings
// a varint length then the bytes, float64 its IEEE-754 bits little-endian.

func appendUvarint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }
func appendVarint(b []byte, v int64) []byte   { return binary.AppendVarint(b, v) }

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendFloat64(b []byte, f float64) []byte {
	return binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

// reader decodes wire primitives from a buffer. The first failure sticks: all
// later reads return zero values, and err reports where decoding went wrong.
// base is added to offsets so that nested buffers report positions in the
// outer one.
type reader struct {
	buf  []byte
	off  int
	base int
	err  *DecodeError
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = &DecodeError{Offset: r.base + r.off, Msg: fmt.Sprintf(format, args...)}
	}
}

func (r *reader) remaining() int { return len(r.buf) - r.off }

func (r *reader) u8(what string) uint8 {
	if r.err != nil {
		return 0
	}
	if r.off >= len(r.buf) {
		r.fail("truncated: missing %s", what)
		return 0
	}
	v := r.buf[r.off]
	r.off++
	return v
}

func (r *reader) boolean(what string) bool {
	v := r.u8(what)
	if v > 1 {
		r.off--
		r.fail("%s: invalid boolean byte %d", what, v)
		return false
	}
	return v == 1
}

func (r *reader) uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.buf[r.off:])
	if n <= 0 {
		if n == 0 {
			r.fail("truncated: missing %s", what)
		} else {
			r.fail("%s: varint overflows 64 bits", what)
		}
		return 0
	}
	r.off += n
	return v
}

func (r *reader) uint32v(what string) uint32 {
	at := r.off
	v := r.uvarint(what)
	if v > math.MaxUint32 {
		r.off = at
		r.fail("%s: %d does not fit 32 bits", what, v)
		return 0
	}
	return uint32(v)
}

func (r *reader) varint(what string) int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.buf[r.off:])
	if n <= 0 {
		if n == 0 {
			r.fail("truncated: missing %s", what)
		} else {
			r.fail("%s: varint overflows 64 bits", what)
		}
		return 0
	}
	r.off += n
	return v
}

// count reads a collection length and checks it against the bytes left, given
// the smallest encoding of one element, so a corrupt count cannot make the
// caller allocate more than the input could possibly hold.
func (r *reader) count(what string, minElemBytes int) int {
	at := r.off
	v := r.uvarint(what)
	if r.err != nil {
		return 0
	}
	if minElemBytes < 1 {
		minElemBytes = 1
	}
	if v > uint64(r.remaining()/minElemBytes) {
		r.off = at
		r.fail("%s: count %d exceeds the %d bytes left", what, v, r.remaining())
		return 0
	}
	return int(v)
}

func (r *reader) str(what string) string {
	return string(r.strView(what))
}

// strView reads a string field as a view of the buffer (no copy): valid
// only as long as the buffer is.
func (r *reader) strView(what string) []byte {
	at := r.off
	n := r.uvarint(what)
	if r.err != nil {
		return nil
	}
	if n > MaxFieldBytes {
		r.off = at
		r.fail("%s: length %d exceeds the %d-byte limit", what, n, MaxFieldBytes)
		return nil
	}
	if n > uint64(r.remaining()) {
		r.off = at
		r.fail("truncated: %s needs %d bytes, %d left", what, n, r.remaining())
		return nil
	}
	v := r.buf[r.off : r.off+int(n) : r.off+int(n)]
	r.off += int(n)
	return v
}

func (r *reader) float64v(what string) float64 {
	if r.err != nil {
		return 0
	}
	if r.remaining() < 8 {
		r.fail("truncated: missing %s", what)
		return 0
	}
	v := math.Float64frombits(binary.LittleEndian.Uint64(r.buf[r.off:]))
	r.off += 8
	return v
}

func (r *reader) bytes(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if r.remaining() < n {
		r.fail("truncated: %s needs %d bytes, %d left", what, n, r.remaining())
		return nil
	}
	b := r.buf[r.off : r.off+n]
	r.off += n
	return b
}
