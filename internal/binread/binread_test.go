package binread

import (
	"encoding/binary"
	"strings"
	"testing"
)

func TestFirstFailureSticks(t *testing.T) {
	b := binary.AppendUvarint(nil, 300)
	b = append(b, 1)
	b = binary.AppendUvarint(b, 5) // a 5-byte string with 2 bytes left
	b = append(b, "ab"...)
	r := Reader{Buf: b, Base: 10}
	if v := r.Uvarint("n"); v != 300 {
		t.Fatalf("Uvarint = %d", v)
	}
	if !r.Bool("flag") {
		t.Fatal("Bool")
	}
	if s := r.String("name", 0); s != "" || !r.Failed() {
		t.Fatalf("String = %q, failed %v", s, r.Failed())
	}
	if r.Err.Offset != 10+3 || r.Err.Field != "name" || !strings.Contains(r.Err.Msg, "name needs 5 bytes, 2 left") {
		t.Fatalf("error %+v", r.Err)
	}
	first := *r.Err
	if r.U8("later") != 0 || r.Uint64BE("later") != 0 || *r.Err != first {
		t.Fatal("a later read changed the first failure")
	}
}

func TestLimits(t *testing.T) {
	over := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}
	for name, read := range map[string]func(r *Reader){
		"varint overflow":  func(r *Reader) { r.Uvarint("v") },
		"count over input": func(r *Reader) { r.Buf = binary.AppendUvarint(nil, 1000); r.Count("c", 0, 1) },
		"count over max":   func(r *Reader) { r.Buf = []byte{9, 0, 0, 0, 0, 0, 0, 0, 0, 0}; r.Count("c", 8, 1) },
		"blob over max":    func(r *Reader) { r.Buf = []byte{3, 'a', 'b', 'c'}; r.BlobView("b", 2) },
		"uint32 overflow":  func(r *Reader) { r.Buf = binary.AppendUvarint(nil, 1<<33); r.Uint32("u") },
		"bad bool":         func(r *Reader) { r.Buf = []byte{2}; r.Bool("b") },
		"trailing":         func(r *Reader) { r.Buf = []byte{1, 2}; r.U8("x"); r.End("x") },
	} {
		r := &Reader{Buf: over}
		read(r)
		if !r.Failed() {
			t.Errorf("%s: no failure", name)
		}
	}
}

func FuzzNeverPanics(f *testing.F) {
	f.Add([]byte{3, 'a', 'b'})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := New(b)
		for !r.Failed() && r.Remaining() > 0 {
			r.U8("a")
			r.Varint("b")
			r.Count("c", 100, 2)
			r.String("d", 16)
			r.Float64LE("e")
			r.Bool("f")
		}
		r.Rest()
	})
}
