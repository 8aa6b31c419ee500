package fsm

import (
	"encoding/binary"
	"math"

	"github.com/tether-project/tether/internal/binread"
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

// reader is the shared binary reader (internal/binread) with fsm's limits
// and error type: strings are at most MaxFieldBytes, failures are
// *DecodeError.
type reader struct{ binread.Reader }

func (r *reader) fail(format string, args ...any) { r.Fail("", format, args...) }

// decodeErr is the failure as a *DecodeError (nil error when none).
func (r *reader) decodeErr() error {
	if r.Err == nil {
		return nil
	}
	return &DecodeError{Offset: r.Err.Offset, Msg: r.Err.Msg}
}

func (r *reader) count(what string, minElemBytes int) int { return r.Count(what, 0, minElemBytes) }

func (r *reader) str(what string) string { return r.String(what, MaxFieldBytes) }

// strView reads a string field as a view of the buffer (no copy): valid
// only as long as the buffer is.
func (r *reader) strView(what string) []byte { return r.BlobView(what, MaxFieldBytes) }
