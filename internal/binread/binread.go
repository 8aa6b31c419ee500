// Package binread is the one reader of tether's binary encodings (the
// affinity log's events, entries and snapshots, the archive's records, the
// cluster transport's payloads, the KV telemetry codecs). A Reader takes a
// byte slice field by field; the first failure sticks — every later read
// returns a zero value — and Err says where decoding went wrong and why.
// It never panics and never allocates more than the input could hold.
//
// Integers are unsigned LEB128 varints (signed ones zig-zag encoded) or
// fixed-width big- or little-endian words, as each format says; a blob or
// string is a varint length and the bytes.
package binread

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Error is a decoding failure at byte Offset (of the outermost buffer:
// Reader.Base is added) while reading Field ("" when the failure is not
// about one field).
type Error struct {
	Offset int
	Field  string
	Msg    string
}

func (e *Error) Error() string { return fmt.Sprintf("offset %d: %s", e.Offset, e.Msg) }

// Reader decodes Buf from Off. Base is added to offsets in errors, so that
// a buffer nested in an outer one reports positions in the outer one.
// Callers may move Off back to the start of a field to report a failure
// there (FailAt).
type Reader struct {
	Buf  []byte
	Off  int
	Base int
	Err  *Error
}

// New returns a reader of b.
func New(b []byte) *Reader { return &Reader{Buf: b} }

// Failed reports whether a read failed.
func (r *Reader) Failed() bool { return r.Err != nil }

// Fail records a failure at the current offset (unless one is recorded).
func (r *Reader) Fail(field, format string, args ...any) { r.FailAt(r.Off, field, format, args...) }

// FailAt records a failure at offset off of Buf.
func (r *Reader) FailAt(off int, field, format string, args ...any) {
	if r.Err == nil {
		r.Err = &Error{Offset: r.Base + off, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
}

// Remaining is the number of bytes not read yet.
func (r *Reader) Remaining() int { return len(r.Buf) - r.Off }

// U8 reads one byte.
func (r *Reader) U8(field string) uint8 {
	if r.Err != nil {
		return 0
	}
	if r.Off >= len(r.Buf) {
		r.Fail(field, "truncated: missing %s", field)
		return 0
	}
	v := r.Buf[r.Off]
	r.Off++
	return v
}

// Bool reads a byte that must be 0 or 1.
func (r *Reader) Bool(field string) bool {
	at := r.Off
	v := r.U8(field)
	if v > 1 {
		r.FailAt(at, field, "%s: invalid boolean byte %d", field, v)
		return false
	}
	return v == 1
}

// Uvarint reads an unsigned varint.
func (r *Reader) Uvarint(field string) uint64 {
	if r.Err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.Buf[r.Off:])
	if !r.advance(n, field) {
		return 0
	}
	return v
}

// Uint32 reads an unsigned varint that must fit 32 bits.
func (r *Reader) Uint32(field string) uint32 {
	at := r.Off
	v := r.Uvarint(field)
	if v > math.MaxUint32 {
		r.FailAt(at, field, "%s: %d does not fit 32 bits", field, v)
		return 0
	}
	return uint32(v)
}

// Varint reads a zig-zag signed varint.
func (r *Reader) Varint(field string) int64 {
	if r.Err != nil {
		return 0
	}
	v, n := binary.Varint(r.Buf[r.Off:])
	if !r.advance(n, field) {
		return 0
	}
	return v
}

// advance moves past a varint of n bytes (binary.Uvarint's n: 0 for a
// truncated one, negative for one beyond 64 bits) or records why it cannot.
func (r *Reader) advance(n int, field string) bool {
	switch {
	case n == 0:
		r.Fail(field, "truncated: missing %s", field)
	case n < 0:
		r.Fail(field, "%s: varint overflows 64 bits", field)
	default:
		r.Off += n
		return true
	}
	return false
}

// Count reads a collection length and checks it against max (0: none) and
// against the bytes left, given the smallest encoding of one element, so a
// corrupt count cannot make the caller allocate more than the input could
// possibly hold.
func (r *Reader) Count(field string, max uint64, minElemBytes int) int {
	at := r.Off
	v := r.Uvarint(field)
	if r.Err != nil {
		return 0
	}
	minElemBytes = maxInt(minElemBytes, 1)
	switch {
	case max > 0 && v > max:
		r.FailAt(at, field, "%s: %d exceeds the limit of %d", field, v, max)
		return 0
	case v > uint64(r.Remaining()/minElemBytes):
		r.FailAt(at, field, "%s: count %d exceeds the %d bytes left", field, v, r.Remaining())
		return 0
	}
	return int(v)
}

// BlobView reads a varint length (at most max bytes; 0: no limit but the
// input) and that many bytes, as a view of Buf (valid as long as Buf is).
func (r *Reader) BlobView(field string, max int) []byte {
	at := r.Off
	n := r.Uvarint(field)
	if r.Err != nil {
		return nil
	}
	if max > 0 && n > uint64(max) {
		r.FailAt(at, field, "%s: length %d exceeds the %d-byte limit", field, n, max)
		return nil
	}
	if n > uint64(r.Remaining()) {
		r.FailAt(at, field, "truncated: %s needs %d bytes, %d left", field, n, r.Remaining())
		return nil
	}
	v := r.Buf[r.Off : r.Off+int(n) : r.Off+int(n)]
	r.Off += int(n)
	return v
}

// String reads a blob (at most max bytes; 0: no limit) as a string.
func (r *Reader) String(field string, max int) string { return string(r.BlobView(field, max)) }

// Bytes reads n bytes as a view of Buf.
func (r *Reader) Bytes(n int, field string) []byte {
	if r.Err != nil {
		return nil
	}
	if n < 0 || r.Remaining() < n {
		r.Fail(field, "truncated: %s needs %d bytes, %d left", field, n, r.Remaining())
		return nil
	}
	b := r.Buf[r.Off : r.Off+n : r.Off+n]
	r.Off += n
	return b
}

// Uint64BE reads a big-endian 64-bit word.
func (r *Reader) Uint64BE(field string) uint64 {
	b := r.Bytes(8, field)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

// Float64LE reads an IEEE-754 float64 stored little-endian.
func (r *Reader) Float64LE(field string) float64 {
	b := r.Bytes(8, field)
	if b == nil {
		return 0
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(b))
}

// Rest reads every byte left, as a view of Buf.
func (r *Reader) Rest() []byte {
	if r.Err != nil {
		return nil
	}
	v := r.Buf[r.Off:]
	r.Off = len(r.Buf)
	return v
}

// End fails unless every byte was read.
func (r *Reader) End(what string) {
	if r.Err == nil && r.Remaining() != 0 {
		r.Fail("", "%d trailing bytes after %s", r.Remaining(), what)
	}
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}
