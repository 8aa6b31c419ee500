package fsm

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"unsafe"

	"github.com/tether-project/tether/internal/binread"
)

// Snapshot stream layout (details in DESIGN.md):
//
//	"TTHRSNAP" magic, one format-version byte
//	chunks:  uvarint body length (0 ends the stream), body, CRC-32C(body) LE
//
// The bodies, concatenated, hold a sequence of records; a record never spans
// two chunks, so each chunk is verified before any of it is decoded and the
// decoder works on an in-memory slice.
const (
	snapshotMagic = "TTHRSNAP"
	// snapshotVersion is the newest format this build writes and reads.
	// Version 2 (feature level 2) adds the unique-epoch start to the header
	// and ranks to bindings; a state without either is still written as
	// version 1, which level-1 builds read (a snapshot installed on a
	// lagging old follower during a rolling upgrade). Version 3 (feature
	// level 3) adds a flags byte to every instance record (the operator's
	// drain); a state below level 3 without a drained instance is written
	// as version 2 or 1.
	snapshotVersion   = 3
	snapshotVersionV2 = 2
	snapshotVersionV1 = 1
	// snapshotChunkTarget: the writer closes a chunk once it holds this much.
	snapshotChunkTarget = 256 << 10
	// snapshotChunkMax bounds a chunk the reader accepts (a record is at most
	// a few hundred KiB even with every field at MaxFieldBytes).
	snapshotChunkMax = 8 << 20
	// snapshotInternMax bounds the interned-string table on both sides.
	snapshotInternMax = 1 << 16
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// snapWriter buffers records into chunks and interns repeated strings.
type snapWriter struct {
	w      io.Writer
	buf    []byte
	err    error
	intern map[string]uint64
}

func (sw *snapWriter) endRecord() {
	if len(sw.buf) >= snapshotChunkTarget {
		sw.flush()
	}
}

func (sw *snapWriter) flush() {
	if sw.err != nil || len(sw.buf) == 0 {
		return
	}
	var head [binary.MaxVarintLen64]byte
	n := binary.PutUvarint(head[:], uint64(len(sw.buf)))
	sum := crc32.Checksum(sw.buf, crcTable)
	sw.buf = binary.LittleEndian.AppendUint32(sw.buf, sum)
	if _, err := sw.w.Write(head[:n]); err != nil {
		sw.err = err
		return
	}
	if _, err := sw.w.Write(sw.buf); err != nil {
		sw.err = err
		return
	}
	sw.buf = sw.buf[:0]
}

// appendRef writes a string through the intern table: uvarint 0 and the
// literal the first time (the string then gets the next id, while the table
// has room), its uvarint id after that. It is appendDecision's ref.
func (sw *snapWriter) appendRef(b []byte, s string) []byte {
	if id, ok := sw.intern[s]; ok {
		return appendUvarint(b, id)
	}
	b = appendUvarint(b, 0)
	b = appendString(b, s)
	if len(sw.intern) < snapshotInternMax {
		sw.intern[s] = uint64(len(sw.intern) + 1)
	}
	return b
}

const (
	snapConvIsKey = 1 // the binding's ConversationID equals its Key
	snapHasRank   = 2 // (version 2) a rank uvarint follows the epoch

	// Instance record flags (version 3).
	snapDrained = 1 // a DrainedSince varint follows
)

// snapshotFormat is the oldest format that holds s.
func (s *State) snapshotFormat() byte {
	if s.featureLevel >= FeatureLevelDrain || slices.ContainsFunc(s.instances, func(in Instance) bool { return in.Drained }) {
		return snapshotVersion
	}
	if s.featureLevel >= FeatureLevelRanks || s.uniqueEpochsFrom != 0 || s.ranked > 0 {
		return snapshotVersionV2
	}
	return snapshotVersionV1
}

// WriteSnapshot streams the state to w. The state is immutable, so a
// snapshot can be written from any goroutine while the machine applies
// later entries.
func (s *State) WriteSnapshot(w io.Writer) error {
	sw := &snapWriter{w: w, buf: make([]byte, 0, snapshotChunkTarget+64<<10), intern: make(map[string]uint64)}
	if _, err := io.WriteString(w, snapshotMagic); err != nil {
		return fmt.Errorf("fsm: write snapshot: %w", err)
	}
	version := s.snapshotFormat()
	if _, err := w.Write([]byte{version}); err != nil {
		return fmt.Errorf("fsm: write snapshot: %w", err)
	}
	s.writeHeader(sw, version)
	s.writeMembers(sw, version)
	s.writeBindings(sw)
	s.writeLinks(sw)
	s.writeDedup(sw)
	sw.flush()
	if sw.err == nil {
		_, sw.err = w.Write([]byte{0}) // end of chunks
	}
	if sw.err != nil {
		return fmt.Errorf("fsm: write snapshot: %w", sw.err)
	}
	return nil
}

// writeHeader writes the header record: position, settings, the state hash
// the reader checks its rebuilt state against, counters, the instance count.
func (s *State) writeHeader(sw *snapWriter, version byte) {
	b := sw.buf
	b = appendUvarint(b, s.index)
	b = appendVarint(b, s.time)
	b = appendUvarint(b, uint64(s.featureLevel))
	b = appendUvarint(b, s.maxBindings)
	if version >= 2 {
		b = appendUvarint(b, s.uniqueEpochsFrom)
	}
	h := s.Hash()
	b = append(b, h[:]...)
	for _, v := range s.counters.scalars {
		b = appendUvarint(b, v)
	}
	b = appendReasonCounts(b, &s.counters.evictions)
	b = appendReasonCounts(b, &s.counters.overflows)
	sw.buf = appendUvarint(b, uint64(len(s.instances)))
	sw.endRecord()
}

// writeMembers writes the instance records, then the node count and records.
func (s *State) writeMembers(sw *snapWriter, version byte) {
	for i := range s.instances {
		in := &s.instances[i]
		sw.buf = appendInstance(sw.buf, in)
		if version >= 3 {
			if in.Drained {
				sw.buf = appendVarint(append(sw.buf, snapDrained), in.DrainedSince)
			} else {
				sw.buf = append(sw.buf, 0)
			}
		}
		sw.endRecord()
	}
	sw.buf = appendUvarint(sw.buf, uint64(len(s.nodes)))
	for i := range s.nodes {
		sw.buf = appendNode(sw.buf, &s.nodes[i])
		sw.endRecord()
	}
}

// writeBindings writes the bindings least recently used first: LastUsed is
// then non-decreasing and stored as a delta, and the reader rebuilds the
// recency order by appending.
func (s *State) writeBindings(sw *snapWriter) {
	sw.buf = appendUvarint(sw.buf, uint64(s.bindings.len()))
	sw.endRecord()
	prevUsed := int64(0)
	ref := sw.appendRef // one method value for every binding, not one each
	s.lru.each(func(r *bindingRec) bool {
		b := append(sw.buf, uint8(r.Fleet))
		var flags uint8
		if r.ConversationID == r.Key {
			flags |= snapConvIsKey
		}
		if r.HasRank {
			flags |= snapHasRank // only in version 2 (snapshotFormat)
		}
		b = append(b, flags)
		b = appendString(b, r.Key)
		if flags&snapConvIsKey == 0 {
			b = appendString(b, r.ConversationID)
		}
		b = sw.appendRef(b, r.Instance)
		b = appendUvarint(b, r.Epoch)
		if r.HasRank {
			b = appendUvarint(b, uint64(r.Rank))
		}
		b = appendVarint(b, r.LastUsed-prevUsed)
		b = appendVarint(b, r.LastUsed-r.BoundAt)
		sw.buf = appendDecision(b, &r.Decision, ref)
		prevUsed = r.LastUsed
		sw.endRecord()
		return sw.err == nil
	})
}

func (s *State) writeLinks(sw *snapWriter) {
	sw.buf = appendUvarint(sw.buf, uint64(s.links.len()))
	sw.endRecord()
	s.links.each(func(l *linkRec) bool {
		b := appendString(sw.buf, l.Child)
		b = sw.appendRef(b, l.Parent)
		b = sw.appendRef(b, l.Root)
		b = append(b, l.Depth)
		b = appendVarint(b, l.CreatedAt)
		sw.buf = appendVarint(b, l.LastUsed)
		sw.endRecord()
		return sw.err == nil
	})
}

// writeDedup writes the two generations of the idempotency window.
func (s *State) writeDedup(sw *snapWriter) {
	for gen, chunk := range []*dedupChunk{s.dedup.cur, s.dedup.prev} {
		n := []int{s.dedup.curLen, s.dedup.prevLen}[gen]
		sw.buf = appendUvarint(sw.buf, uint64(n))
		sw.endRecord()
		for i := 0; i < n && sw.err == nil; i++ {
			sw.buf = append(sw.buf, chunk.ids[i][:]...)
			sw.endRecord()
		}
	}
}

func appendReasonCounts(b []byte, counts *[256]uint64) []byte {
	n := 0
	for _, v := range counts {
		if v != 0 {
			n++
		}
	}
	b = appendUvarint(b, uint64(n))
	for r, v := range counts {
		if v != 0 {
			b = append(b, byte(r))
			b = appendUvarint(b, v)
		}
	}
	return b
}

// snapReader walks the records of a snapshot stream chunk by chunk.
type snapReader struct {
	br       *bufio.Reader
	r        reader // the current chunk body
	chunk    int    // number of chunks read
	streamAt int64  // stream offset of the current chunk body
	read     int64  // bytes consumed from the stream
	ended    bool
	ioErr    error // a read error of the underlying stream (not EOF)
	intern   []string
}

// SnapshotError reports a snapshot that cannot be read: truncated, corrupt
// or from a newer format.
type SnapshotError struct {
	Offset int64 // byte offset in the stream, where known
	Msg    string
}

func (e *SnapshotError) Error() string {
	return fmt.Sprintf("fsm: snapshot unreadable at byte %d: %s", e.Offset, e.Msg)
}

func (sr *snapReader) errorf(format string, args ...any) error {
	return &SnapshotError{Offset: sr.streamAt + int64(sr.r.Off), Msg: fmt.Sprintf(format, args...)}
}

// decodeErr converts a failure of the chunk decoder to a SnapshotError.
func (sr *snapReader) decodeErr() error {
	return &SnapshotError{Offset: sr.streamAt + int64(sr.r.Err.Offset), Msg: sr.r.Err.Msg}
}

func (sr *snapReader) readFull(b []byte, what string) error {
	n, err := io.ReadFull(sr.br, b)
	sr.read += int64(n)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return &SnapshotError{Offset: sr.read, Msg: "truncated: stream ends inside " + what}
		}
		return fmt.Errorf("fsm: read snapshot: %w", err)
	}
	return nil
}

// record prepares the next record: it loads the next chunk when the current
// one is used up. what names the record for the truncation message.
func (sr *snapReader) record(what string) error {
	if sr.r.Failed() {
		return sr.decodeErr()
	}
	if sr.r.Remaining() > 0 {
		return nil
	}
	if sr.ended {
		return &SnapshotError{Offset: sr.read, Msg: "truncated: the chunk stream ended before " + what}
	}
	n, err := binary.ReadUvarint(byteCounter{sr})
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return &SnapshotError{Offset: sr.read, Msg: fmt.Sprintf("truncated: stream ends before chunk %d (expecting %s)", sr.chunk+1, what)}
		}
		if sr.ioErr != nil {
			return fmt.Errorf("fsm: read snapshot: %w", err)
		}
		return &SnapshotError{Offset: sr.read, Msg: fmt.Sprintf("chunk %d length: %v", sr.chunk+1, err)}
	}
	if n == 0 {
		sr.ended = true
		return &SnapshotError{Offset: sr.read, Msg: "truncated: the chunk stream ended before " + what}
	}
	if n > snapshotChunkMax {
		return &SnapshotError{Offset: sr.read, Msg: fmt.Sprintf("chunk %d claims %d bytes, more than the %d-byte limit", sr.chunk+1, n, snapshotChunkMax)}
	}
	buf := sr.r.Buf
	if uint64(cap(buf)) < n+4 {
		buf = make([]byte, n+4)
	}
	buf = buf[:n+4]
	sr.streamAt = sr.read
	if err := sr.readFull(buf, fmt.Sprintf("chunk %d", sr.chunk+1)); err != nil {
		return err
	}
	sr.chunk++
	body := buf[:n]
	if got, want := crc32.Checksum(body, crcTable), binary.LittleEndian.Uint32(buf[n:]); got != want {
		return &SnapshotError{Offset: sr.streamAt, Msg: fmt.Sprintf("chunk %d checksum mismatch (CRC-32C %08x, recorded %08x): the snapshot is corrupt", sr.chunk, got, want)}
	}
	sr.r = reader{binread.Reader{Buf: body}}
	return nil
}

// byteCounter lets binary.ReadUvarint read from the bufio.Reader while
// counting the stream offset.
type byteCounter struct{ sr *snapReader }

func (bc byteCounter) ReadByte() (byte, error) {
	b, err := bc.sr.br.ReadByte()
	if err == nil {
		bc.sr.read++
	} else if !errors.Is(err, io.EOF) {
		bc.sr.ioErr = err
	}
	return b, err
}

func (sr *snapReader) ref(what string) string {
	r := &sr.r
	at := r.Off
	id := r.Uvarint(what)
	if r.Failed() {
		return ""
	}
	if id == 0 {
		s := r.str(what)
		if !r.Failed() && len(sr.intern) < snapshotInternMax {
			sr.intern = append(sr.intern, s)
		}
		return s
	}
	if id > uint64(len(sr.intern)) {
		r.Off = at
		r.fail("%s: string reference %d, only %d strings interned", what, id, len(sr.intern))
		return ""
	}
	return sr.intern[id-1]
}

// count reads a section's record count (a record of its own).
func (sr *snapReader) count(what string) (uint64, error) {
	if err := sr.record(what + " count"); err != nil {
		return 0, err
	}
	n := sr.r.Uvarint(what + " count")
	if sr.r.Failed() {
		return 0, sr.decodeErr()
	}
	return n, nil
}

// ReadSnapshot reads a snapshot written by WriteSnapshot. It streams (memory
// is the state being built plus one chunk), verifies every chunk's checksum
// before decoding it and the rebuilt state's hash against the recorded one,
// and returns *SnapshotError for truncated, corrupt or newer-format input. It
// never panics.
func ReadSnapshot(r io.Reader) (*State, error) {
	sr := &snapReader{br: bufio.NewReaderSize(r, 64<<10), intern: make([]string, 0, 256)}
	version, err := sr.readPreamble()
	if err != nil {
		return nil, err
	}
	b := newStateBuilder()
	recorded, nInstances, err := sr.readHeader(b.s, version)
	if err != nil {
		return nil, err
	}
	for _, section := range []func() error{
		func() error { return sr.readInstances(b, nInstances, version) },
		func() error { return sr.readNodes(b) },
		func() error { return sr.readBindings(b, version) },
		func() error { return sr.readLinks(b) },
		func() error { return sr.readDedup(b) },
		sr.readEnd,
	} {
		if err := section(); err != nil {
			return nil, err
		}
	}
	st, err := b.finish()
	if err != nil {
		return nil, &SnapshotError{Offset: sr.read, Msg: err.Error()}
	}
	if got := st.Hash(); got != recorded {
		return nil, &SnapshotError{Offset: sr.read, Msg: fmt.Sprintf(
			"rebuilt state hash %x does not match the recorded %x", got[:8], recorded[:8])}
	}
	return st, nil
}

// readPreamble checks the magic and returns the format version.
func (sr *snapReader) readPreamble() (byte, error) {
	var head [len(snapshotMagic) + 1]byte
	if err := sr.readFull(head[:], "the header"); err != nil {
		return 0, err
	}
	if string(head[:len(snapshotMagic)]) != snapshotMagic {
		return 0, &SnapshotError{Offset: 0, Msg: fmt.Sprintf("not a tether fsm snapshot (magic %q)", head[:len(snapshotMagic)])}
	}
	version := head[len(snapshotMagic)]
	if version < snapshotVersionV1 || version > snapshotVersion {
		return 0, &SnapshotError{Offset: int64(len(snapshotMagic)), Msg: fmt.Sprintf(
			"snapshot format version %d; this build reads versions %d to %d: upgrade this node to the tether release that wrote it",
			version, snapshotVersionV1, snapshotVersion)}
	}
	return version, nil
}

// readHeader reads the header record into s: it returns the recorded state
// hash and the number of instance records that follow.
func (sr *snapReader) readHeader(s *State, version byte) (recorded [32]byte, nInstances uint64, err error) {
	if err := sr.record("the header"); err != nil {
		return recorded, 0, err
	}
	rd := &sr.r
	s.index = rd.Uvarint("index")
	s.time = rd.Varint("time")
	s.featureLevel = rd.Uint32("feature level")
	s.maxBindings = rd.Uvarint("max bindings")
	if version >= 2 {
		s.uniqueEpochsFrom = rd.Uvarint("unique epochs from")
	}
	copy(recorded[:], rd.Bytes(32, "state hash"))
	for i := range s.counters.scalars {
		s.counters.scalars[i] = rd.Uvarint("counter")
	}
	readReasonCounts(rd, &s.counters.evictions, "eviction counters")
	readReasonCounts(rd, &s.counters.overflows, "overflow counters")
	nInstances = rd.Uvarint("instance count")
	if rd.Failed() {
		return recorded, 0, sr.decodeErr()
	}
	if s.maxBindings == 0 {
		return recorded, 0, sr.errorf("max bindings is 0")
	}
	return recorded, nInstances, nil
}

// eachRecord reads n records named what, calling read for each after its
// record is loaded; read decodes from sr.r and returns the builder's verdict.
func (sr *snapReader) eachRecord(n uint64, what string, read func(i uint64) error) error {
	for i := uint64(0); i < n; i++ {
		if err := sr.record(what); err != nil {
			return err
		}
		if err := read(i); err != nil {
			return err
		}
	}
	return nil
}

// added turns a record's decode error or the builder's refusal into a
// SnapshotError.
func (sr *snapReader) added(err error, format string, args ...any) error {
	if sr.r.Failed() {
		return sr.decodeErr()
	}
	if err != nil {
		return sr.errorf(format+"%v", append(args, err)...)
	}
	return nil
}

func (sr *snapReader) readInstances(b *stateBuilder, n uint64, version byte) error {
	return sr.eachRecord(n, "an instance", func(i uint64) error {
		in := readInstance(&sr.r)
		if version >= 3 {
			at := sr.r.Off
			flags := sr.r.U8("instance flags")
			if !sr.r.Failed() && flags&^snapDrained != 0 {
				sr.r.Off = at
				return sr.errorf("instance %d: unknown flag bits 0x%02x", i+1, flags)
			}
			if flags&snapDrained != 0 {
				in.Drained = true
				in.DrainedSince = sr.r.Varint("instance drained since")
			}
		}
		if sr.r.Failed() {
			return sr.decodeErr()
		}
		return sr.added(b.addInstance(in), "")
	})
}

func (sr *snapReader) readNodes(b *stateBuilder) error {
	n, err := sr.count("node")
	if err != nil {
		return err
	}
	return sr.eachRecord(n, "a node", func(uint64) error {
		nd := readNode(&sr.r)
		if sr.r.Failed() {
			return sr.decodeErr()
		}
		return sr.added(b.addNode(nd), "")
	})
}

func (sr *snapReader) readBindings(b *stateBuilder, version byte) error {
	n, err := sr.count("binding")
	if err != nil {
		return err
	}
	known := uint8(snapConvIsKey)
	if version >= 2 {
		known |= snapHasRank
	}
	prevUsed := int64(0)
	for i := uint64(0); i < n; i++ {
		if err := sr.record("a binding"); err != nil {
			var se *SnapshotError
			if errors.As(err, &se) {
				se.Msg = fmt.Sprintf("binding %d of %d: %s", i+1, n, se.Msg)
			}
			return err
		}
		x, flags := sr.readBinding(prevUsed)
		if sr.r.Failed() {
			return sr.decodeErr()
		}
		if flags&^known != 0 {
			return sr.errorf("binding %d: unknown flag bits 0x%02x", i+1, flags)
		}
		if x.LastUsed < prevUsed {
			return sr.errorf("binding %d: bindings out of recency order", i+1)
		}
		prevUsed = x.LastUsed
		if err := b.addBinding(x); err != nil {
			return sr.errorf("binding %d: %v", i+1, err)
		}
	}
	return nil
}

// readBinding decodes one binding record; LastUsed is stored as a delta from
// the previous binding's (prevUsed), BoundAt as a delta back from LastUsed.
func (sr *snapReader) readBinding(prevUsed int64) (Binding, uint8) {
	rd := &sr.r
	var x Binding
	x.Fleet = Fleet(rd.U8("binding fleet"))
	flags := rd.U8("binding flags")
	// A short key is copied into its record by addBinding (newBindingRec),
	// so it is read as a view of the chunk instead of being allocated once
	// more only to become garbage.
	if view := rd.strView("binding key"); len(view) > 0 && len(view) <= inlineKeyBytes {
		x.Key = unsafe.String(&view[0], len(view))
	} else {
		x.Key = string(view)
	}
	if flags&snapConvIsKey != 0 {
		x.ConversationID = x.Key
	} else {
		x.ConversationID = rd.str("binding conversation id")
	}
	x.Instance = sr.ref("binding instance")
	x.Epoch = rd.Uvarint("binding epoch")
	if flags&snapHasRank != 0 {
		x.Rank = rd.Uint32("binding rank")
		x.HasRank = true
	}
	x.LastUsed = prevUsed + rd.Varint("binding last use")
	x.BoundAt = x.LastUsed - rd.Varint("binding bound-at")
	x.Decision = readDecisionWith(rd, sr.ref)
	return x, flags
}

func (sr *snapReader) readLinks(b *stateBuilder) error {
	n, err := sr.count("link")
	if err != nil {
		return err
	}
	return sr.eachRecord(n, "a link", func(i uint64) error {
		rd := &sr.r
		var l ParentLink
		l.Child = rd.str("link child")
		l.Parent = sr.ref("link parent")
		l.Root = sr.ref("link root")
		l.Depth = rd.U8("link depth")
		l.CreatedAt = rd.Varint("link created-at")
		l.LastUsed = rd.Varint("link last use")
		return sr.added(b.addLink(l), "link %d: ", i+1)
	})
}

// readDedup reads the two generations of the idempotency window.
func (sr *snapReader) readDedup(b *stateBuilder) error {
	for gen := 0; gen < 2; gen++ {
		n, err := sr.count("proposal id")
		if err != nil {
			return err
		}
		if n > dedupGeneration {
			return sr.errorf("idempotency generation of %d ids, the limit is %d", n, dedupGeneration)
		}
		err = sr.eachRecord(n, "a proposal id", func(uint64) error {
			var id ProposalID
			copy(id[:], sr.r.Bytes(proposalIDBytes, "proposal id"))
			return sr.added(b.addDedup(gen, id), "")
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// readEnd checks that the last section used up the stream: no bytes left in
// the last chunk and the end marker next.
func (sr *snapReader) readEnd() error {
	if sr.r.Remaining() != 0 {
		return sr.errorf("%d unexpected bytes after the last record", sr.r.Remaining())
	}
	var end [1]byte
	if err := sr.readFull(end[:], "the end marker"); err != nil {
		return err
	}
	if end[0] != 0 {
		return &SnapshotError{Offset: sr.read - 1, Msg: "records continue past the last section"}
	}
	return nil
}

func readReasonCounts(r *reader, counts *[256]uint64, what string) {
	n := r.count(what, 2)
	for i := 0; i < n && !r.Failed(); i++ {
		reason := r.U8(what)
		counts[reason] = r.Uvarint(what)
	}
}

func readInstance(r *reader) Instance {
	var in Instance
	in.ID = r.str("instance id")
	in.Fleet = Fleet(r.U8("instance fleet"))
	in.URL = r.str("instance url")
	in.Status = InstanceStatus(r.U8("instance status"))
	in.Version = r.str("instance version")
	in.FeatureLevel = r.Uint32("instance feature level")
	in.Ranks = r.Uint32("instance ranks")
	in.Since = r.Varint("instance since")
	return in
}

func readNode(r *reader) Edge {
	var n Edge
	n.ID = r.str("node id")
	n.Version = r.str("node version")
	n.MaxFeatureLevel = r.Uint32("node max feature level")
	n.Since = r.Varint("node since")
	return n
}

// stateBuilder assembles a State from snapshot records. It collects
// records and builds each trie in one pass at the end (buildPmap), owning
// every node it creates, and recomputes every record digest, which is what
// lets ReadSnapshot check the recorded hash.
type stateBuilder struct {
	s         *State
	owner     uint64
	scratch   []byte
	bindings  []*bindingRec
	counts    map[FleetKey]int
	links     []*linkRec
	roots     map[string][]string
	dedupSeen map[ProposalID]struct{}
}

func newStateBuilder() *stateBuilder {
	s := emptyState()
	return &stateBuilder{s: s, owner: newOwner(), counts: make(map[FleetKey]int), roots: make(map[string][]string),
		dedupSeen: make(map[ProposalID]struct{})}
}

func (b *stateBuilder) addInstance(in Instance) error {
	s := b.s
	if in.ID == "" {
		return errors.New("instance with an empty id")
	}
	if n := len(s.instances); n > 0 && s.instances[n-1].ID >= in.ID {
		return fmt.Errorf("instance %q out of order or repeated", in.ID)
	}
	s.instances = append(s.instances, in)
	var d [32]byte
	d, b.scratch = instanceDigest(b.scratch, &in)
	s.digest.add(&d)
	return nil
}

func (b *stateBuilder) addNode(n Edge) error {
	s := b.s
	if n.ID == "" {
		return errors.New("node with an empty id")
	}
	if k := len(s.nodes); k > 0 && s.nodes[k-1].ID >= n.ID {
		return fmt.Errorf("node %q out of order or repeated", n.ID)
	}
	s.nodes = append(s.nodes, n)
	var d [32]byte
	d, b.scratch = nodeDigest(b.scratch, &n)
	s.digest.add(&d)
	return nil
}

// addBinding takes bindings in recency order.
func (b *stateBuilder) addBinding(x Binding) error {
	s := b.s
	if !x.Fleet.Valid() || x.Key == "" || x.Instance == "" {
		return fmt.Errorf("invalid binding (fleet %d, key %q, instance %q)", uint8(x.Fleet), x.Key, x.Instance)
	}
	rec := newBindingRec(&x)
	rec.seq = s.nextSeq
	s.nextSeq++
	b.bindings = append(b.bindings, rec)
	s.lru.insert(b.owner, rec.seq, rec)
	var d [32]byte
	d, b.scratch = bindingDigest(b.scratch, &rec.Binding)
	s.digest.add(&d)
	b.counts[FleetKey{Fleet: x.Fleet, Key: x.Instance}]++
	if x.HasRank {
		s.ranked++
	}
	return nil
}

func (b *stateBuilder) addLink(l ParentLink) error {
	s := b.s
	if l.Child == "" || l.Parent == "" || l.Root == "" || l.Child == l.Root {
		return fmt.Errorf("invalid link (child %q, parent %q, root %q)", l.Child, l.Parent, l.Root)
	}
	b.links = append(b.links, &linkRec{l})
	b.roots[l.Root] = append(b.roots[l.Root], l.Child)
	var d [32]byte
	d, b.scratch = linkDigest(b.scratch, &l)
	s.digest.add(&d)
	return nil
}

// addDedup takes generation 0 (current) and then 1 (previous), each in
// apply order. The arrays it fills belong to no machine (owner 0): the
// first machine to append copies the current one.
func (b *stateBuilder) addDedup(gen int, id ProposalID) error {
	if id == (ProposalID{}) {
		return errors.New("zero proposal id in the idempotency window")
	}
	if _, dup := b.dedupSeen[id]; dup {
		return fmt.Errorf("proposal id %x repeated", id[:])
	}
	b.dedupSeen[id] = struct{}{}
	w := &b.s.dedup
	d := dedupDigest(id)
	if gen == 0 {
		if w.cur == nil {
			w.cur = &dedupChunk{}
		}
		w.cur.ids[w.curLen] = id
		w.curLen++
		w.curSum.add(&d)
	} else {
		if w.prev == nil {
			w.prev = &dedupChunk{}
		}
		w.prev.ids[w.prevLen] = id
		w.prevLen++
		w.prevSum.add(&d)
	}
	return nil
}

func (b *stateBuilder) finish() (*State, error) {
	s := b.s
	var ok bool
	var dup string
	if s.bindings, dup, ok = buildPmap(b.owner, b.bindings); !ok {
		return nil, fmt.Errorf("binding key %q appears twice", dup)
	}
	counts := make([]*countRec, 0, len(b.counts))
	for k, n := range b.counts {
		counts = append(counts, &countRec{fleet: k.Fleet, instance: k.Key, n: n})
	}
	s.counts, _, _ = buildPmap(b.owner, counts) // map keys are distinct
	if s.links, dup, ok = buildPmap(b.owner, b.links); !ok {
		return nil, fmt.Errorf("child %q linked twice", dup)
	}
	roots := make([]*rootRec, 0, len(b.roots))
	for r, children := range b.roots {
		slices.Sort(children)
		roots = append(roots, &rootRec{root: r, children: children})
	}
	s.roots, _, _ = buildPmap(b.owner, roots)
	if w := &s.dedup; w.prev != nil && (w.cur == nil || w.prevLen != dedupGeneration) {
		return nil, fmt.Errorf("idempotency window: a previous generation of %d ids (must be full, %d, and follow a current one)", w.prevLen, dedupGeneration)
	}
	return s, nil
}
