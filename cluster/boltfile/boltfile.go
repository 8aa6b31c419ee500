// Package boltfile checks a bbolt database file's structure before bbolt
// opens it. bbolt trusts its meta page: on a truncated file it follows page
// numbers past the end of the file and panics ("invalid freelist page"), or
// faults in its mmap (SIGBUS), and in both cases keeps the file mapped and
// locked. Checking the few facts Open relies on first turns that damage
// into an error naming the file; Open wraps a bbolt open with the check and
// with the recovery of whatever damage still panics.
package boltfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"runtime/debug"
)

// bbolt's on-disk layout (go.etcd.io/bbolt/internal/common): a page starts
// with a 16-byte header (id u64, flags u16, count u16, overflow u32); pages 0
// and 1 hold a meta (magic u32, version u32, pageSize u32, flags u32, root
// bucket {pgid u64, sequence u64}, freelist pgid u64, high-water pgid u64,
// txid u64, checksum u64 = FNV-64a of the bytes before it), in the machine's
// byte order.
const (
	pageHeaderSize   = 16
	metaSize         = 64
	metaChecksumAt   = 56
	magic            = 0xED0CDAED
	version          = 2
	freelistPageFlag = 0x10
	noFreelist       = ^uint64(0)
	minPageSize      = 1024
	maxPageSize      = 1 << 20
)

type meta struct {
	pageSize           uint32
	root, freelist, hw uint64
	txid               uint64
}

// ErrDamaged marks a file whose structure bbolt cannot open safely.
var ErrDamaged = errors.New("damaged database file")

// OpenFileFunc is bbolt's Options.OpenFile.
type OpenFileFunc = func(name string, flag int, mode os.FileMode) (*os.File, error)

// Open opens the bbolt file at path safely: Check first, then open, which
// must hand openFile to bbolt as its Options.OpenFile (directly, or through
// raft-boltdb's BoltOptions). A panic inside bbolt on damage the check
// cannot see, or a fault in its mmap (made a panic here), becomes an error
// wrapping ErrDamaged, and the file bbolt had opened is closed so its lock
// is released.
func Open[T any](path string, open func(openFile OpenFileFunc) (T, error)) (db T, err error) {
	if err := Check(path); err != nil {
		return db, err
	}
	var opened *os.File
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if opened != nil {
				opened.Close()
			}
			var zero T
			db, err = zero, fmt.Errorf("%w (bbolt: %v)", ErrDamaged, r)
		}
	}()
	return open(func(name string, flag int, mode os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(name, flag, mode)
		opened = f
		return f, err
	})
}

// Check reports whether the bbolt file at path can be opened without bbolt
// reading past its end: the newest valid meta page's high-water mark, root
// and freelist pages lie inside the file and the freelist page is one. A
// missing or empty file is fine (bbolt creates it); a file with no valid
// meta page is left to bbolt, which refuses it with an error of its own.
func Check(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	if size == 0 {
		return nil
	}
	m0, ok0 := readMeta(f, 0)
	pageSize := int64(4096)
	if ok0 {
		pageSize = int64(m0.pageSize)
	}
	m1, ok1 := readMeta(f, pageSize)
	var m meta
	switch {
	case ok0 && ok1:
		m = m0
		if m1.txid > m0.txid {
			m = m1
		}
	case ok0:
		m = m0
	case ok1:
		m = m1
	default:
		return nil // bbolt reports "invalid database" itself
	}
	ps := int64(m.pageSize)
	if m.hw > uint64(size/ps) {
		return fmt.Errorf("%w: %d bytes hold %d pages of %d bytes, but the meta page says %d are in use (truncated?)",
			ErrDamaged, size, size/ps, ps, m.hw)
	}
	if m.root >= m.hw {
		return fmt.Errorf("%w: root bucket page %d beyond the %d pages in use", ErrDamaged, m.root, m.hw)
	}
	if m.freelist == noFreelist {
		return nil
	}
	if m.freelist >= m.hw {
		return fmt.Errorf("%w: freelist page %d beyond the %d pages in use", ErrDamaged, m.freelist, m.hw)
	}
	var h [pageHeaderSize]byte
	if _, err := f.ReadAt(h[:], int64(m.freelist)*ps); err != nil {
		return fmt.Errorf("%w: read freelist page %d: %v", ErrDamaged, m.freelist, err)
	}
	flags := binary.NativeEndian.Uint16(h[8:])
	overflow := binary.NativeEndian.Uint32(h[12:])
	if flags != freelistPageFlag {
		return fmt.Errorf("%w: page %d should hold the freelist but has flags 0x%02x", ErrDamaged, m.freelist, flags)
	}
	if m.freelist+uint64(overflow) >= m.hw {
		return fmt.Errorf("%w: freelist pages %d..%d beyond the %d pages in use", ErrDamaged, m.freelist, m.freelist+uint64(overflow), m.hw)
	}
	return nil
}

// readMeta reads and validates the meta page at offset.
func readMeta(r io.ReaderAt, offset int64) (meta, bool) {
	var b [pageHeaderSize + metaSize]byte
	if _, err := r.ReadAt(b[:], offset); err != nil {
		return meta{}, false
	}
	m := b[pageHeaderSize:]
	ne := binary.NativeEndian
	if ne.Uint32(m[0:]) != magic || ne.Uint32(m[4:]) != version {
		return meta{}, false
	}
	h := fnv.New64a()
	h.Write(m[:metaChecksumAt])
	if h.Sum64() != ne.Uint64(m[metaChecksumAt:]) {
		return meta{}, false
	}
	out := meta{
		pageSize: ne.Uint32(m[8:]),
		root:     ne.Uint64(m[16:]),
		freelist: ne.Uint64(m[32:]),
		hw:       ne.Uint64(m[40:]),
		txid:     ne.Uint64(m[48:]),
	}
	if out.pageSize < minPageSize || out.pageSize > maxPageSize || out.pageSize&(out.pageSize-1) != 0 {
		return meta{}, false
	}
	return out, true
}
