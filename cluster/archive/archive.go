// Package archive keeps every committed affinity-log entry in a bbolt file
// (DataDir/archive.db), with the effects its apply had and a per-key index,
// so `tether audit` can answer "what happened to this key" without replaying
// the log, and can replay the log when it wants to. The Raft log itself is
// compacted by snapshots; the archive is the long-lived record, bounded only
// by its own retention (age and event count), trimmed in the background.
package archive

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/tether-project/tether/cluster/boltfile"
	"github.com/tether-project/tether/fsm"
)

var (
	bucketRecords  = []byte("records")  // index (u64 BE) → encoded record
	bucketKeys     = []byte("keys")     // fleet u8 | uvarint len | key | index u64 BE → nil
	bucketMeta     = []byte("meta")     // see meta* keys
	bucketRestores = []byte("restores") // snapshot index u64 BE → wall time of the restore (i64 BE)
	bucketLinks    = []byte("links")    // uvarint len | root | index u64 BE → nil: Link events by root

	metaTrimmedFrom = []byte("trimmed_from") // first index ever trimmed
	metaTrimmedTo   = []byte("trimmed_to")   // last index trimmed (records ≤ it are gone for good)
	metaEvents      = []byte("events")       // proposals held in the records bucket
	// metaLinksFrom: records at or above this index have their Link events
	// in bucketLinks (an archive written before the links index existed
	// gets it set to its next index when a node first opens it).
	metaLinksFrom = []byte("links_from")
)

// Options configure an archive.
type Options struct {
	// MaxAge drops records whose log time is older than the newest record's
	// log time minus MaxAge (0 = no age limit). Log time, not the wall
	// clock, so an idle cluster keeps its history.
	MaxAge time.Duration
	// MaxEvents keeps at most this many events (proposals), dropping whole
	// records oldest first (0 = no limit).
	MaxEvents uint64
	// TrimInterval is how often the background trimmer checks the limits
	// (default 1s). Appends that cross MaxEvents wake it early.
	TrimInterval time.Duration
	// TrimBatch bounds the records deleted per write transaction (default
	// 512) so trimming never holds the write lock long enough to stall apply.
	TrimBatch int
	// ReadOnly opens an existing archive for offline audit: no writes, no
	// trimmer, and a shared lock (fails while a node holds the file).
	ReadOnly bool
	// Timeout bounds waiting for the file lock (default 1s).
	Timeout time.Duration
	// NoSync skips fsync on commit: only for bulk loading and benchmarks,
	// where a crash may lose or corrupt the file.
	NoSync bool
	Logger *slog.Logger
}

// Archive is an open archive file.
type Archive struct {
	db   *bolt.DB
	path string
	opts Options
	log  *slog.Logger

	kick     chan struct{}
	stopTrim context.CancelFunc
	done     chan struct{}
	closeMu  sync.Mutex
	closed   bool
	closeErr error
}

// ErrClosed is returned by operations on a closed archive.
var ErrClosed = errors.New("archive: closed")

// Open opens (creating unless ReadOnly) the archive at path.
func Open(path string, opts Options) (*Archive, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = time.Second
	}
	if opts.TrimInterval <= 0 {
		opts.TrimInterval = time.Second
	}
	if opts.TrimBatch <= 0 {
		opts.TrimBatch = 512
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if opts.ReadOnly {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("archive: open %s: %w", path, err)
		}
	}
	db, err := openBolt(path, &bolt.Options{Timeout: opts.Timeout, ReadOnly: opts.ReadOnly})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("archive: open %s: the file is locked by a running node (waited %s); copy the data directory first and audit the copy: %w", path, opts.Timeout, err)
		}
		return nil, fmt.Errorf("archive: open %s: %w", path, err)
	}
	db.NoSync = opts.NoSync
	a := &Archive{db: db, path: path, opts: opts, log: logger}
	if opts.ReadOnly {
		return a, nil
	}
	err = db.Update(func(tx *bolt.Tx) error {
		hadLinks := tx.Bucket(bucketLinks) != nil
		for _, name := range [][]byte{bucketRecords, bucketKeys, bucketMeta, bucketRestores, bucketLinks} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("create bucket %s: %w", name, err)
			}
		}
		if hadLinks {
			return nil
		}
		// Records already here were written without the links index.
		from := uint64(1)
		if k, _ := tx.Bucket(bucketRecords).Cursor().Last(); len(k) == 8 {
			from = binary.BigEndian.Uint64(k) + 1
		}
		return putMetaU64(tx.Bucket(bucketMeta), metaLinksFrom, from)
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("archive: open %s: %w", path, err)
	}
	if opts.MaxAge > 0 || opts.MaxEvents > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		a.kick = make(chan struct{}, 1)
		a.stopTrim = cancel
		a.done = make(chan struct{})
		go a.trimLoop(ctx)
	}
	return a, nil
}

// openBolt is bolt.Open behind boltfile's check and panic recovery.
func openBolt(path string, o *bolt.Options) (*bolt.DB, error) {
	return boltfile.Open(path, func(openFile boltfile.OpenFileFunc) (*bolt.DB, error) {
		opts := *o
		opts.OpenFile = openFile
		return bolt.Open(path, 0o600, &opts)
	})
}

// Path is the archive's file.
func (a *Archive) Path() string { return a.path }

// Close stops the trimmer and closes the file. Idempotent.
func (a *Archive) Close() error {
	a.closeMu.Lock()
	defer a.closeMu.Unlock()
	if a.closed {
		return a.closeErr
	}
	a.closed = true
	if a.stopTrim != nil {
		a.stopTrim()
		<-a.done
	}
	if err := a.db.Close(); err != nil {
		a.closeErr = fmt.Errorf("archive: close %s: %w", a.path, err)
	}
	return a.closeErr
}

func u64key(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func keyPrefix(f fsm.Fleet, key string) []byte {
	b := make([]byte, 0, 1+binary.MaxVarintLen64+len(key)+8)
	b = append(b, byte(f))
	b = binary.AppendUvarint(b, uint64(len(key)))
	return append(b, key...)
}

func keyIndexKey(k fsm.FleetKey, index uint64) []byte {
	return binary.BigEndian.AppendUint64(keyPrefix(k.Fleet, k.Key), index)
}

func linkPrefix(root string) []byte {
	b := make([]byte, 0, binary.MaxVarintLen64+len(root)+8)
	b = binary.AppendUvarint(b, uint64(len(root)))
	return append(b, root...)
}

func linkIndexKey(root string, index uint64) []byte {
	return binary.BigEndian.AppendUint64(linkPrefix(root), index)
}

func metaU64(meta *bolt.Bucket, k []byte) uint64 {
	if meta == nil {
		return 0
	}
	v := meta.Get(k)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

func putMetaU64(meta *bolt.Bucket, k []byte, v uint64) error {
	return meta.Put(k, u64key(v))
}

// Append stores records in one write transaction (one fsync). Records at or
// below the trimmed horizon are ignored (a node replaying its log after a
// restart must not resurrect trimmed history); a record already present is
// replaced by the same content, so replay after a restart is harmless.
func (a *Archive) Append(records []Record) error {
	if len(records) == 0 {
		return nil
	}
	if a.opts.ReadOnly {
		return fmt.Errorf("archive: append to %s: opened read-only", a.path)
	}
	var overLimit bool
	err := a.db.Update(func(tx *bolt.Tx) error {
		recs, keys, meta, links := tx.Bucket(bucketRecords), tx.Bucket(bucketKeys), tx.Bucket(bucketMeta), tx.Bucket(bucketLinks)
		trimmedTo := metaU64(meta, metaTrimmedTo)
		events := metaU64(meta, metaEvents)
		for _, r := range records {
			if r.Index == 0 || r.Index <= trimmedTo {
				continue
			}
			k := u64key(r.Index)
			if old := recs.Get(k); old != nil {
				if _, n, err := decodeRecordHeader(old); err == nil && uint64(n) <= events {
					events -= uint64(n)
				}
			}
			terms := r.indexTerms()
			n := terms.proposals
			if err := recs.Put(k, encodeRecord(r, n)); err != nil {
				return fmt.Errorf("put record %d: %w", r.Index, err)
			}
			events += uint64(n)
			for _, fk := range terms.keys {
				if err := keys.Put(keyIndexKey(fk, r.Index), nil); err != nil {
					return fmt.Errorf("index record %d: %w", r.Index, err)
				}
			}
			for _, root := range terms.roots {
				if err := links.Put(linkIndexKey(root, r.Index), nil); err != nil {
					return fmt.Errorf("index links of record %d: %w", r.Index, err)
				}
			}
		}
		overLimit = a.opts.MaxEvents > 0 && events > a.opts.MaxEvents
		return putMetaU64(meta, metaEvents, events)
	})
	if err != nil {
		return fmt.Errorf("archive: append %d records (%d..%d): %w", len(records), records[0].Index, records[len(records)-1].Index, err)
	}
	if overLimit && a.kick != nil {
		select {
		case a.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// NoteRestore records that the node replaced its state from a snapshot at
// index: entries before it may be missing from this archive (they were
// applied elsewhere and arrived compacted). at is the wall time of the
// restore, informational.
func (a *Archive) NoteRestore(index uint64, at time.Time) error {
	if a.opts.ReadOnly {
		return fmt.Errorf("archive: note restore in %s: opened read-only", a.path)
	}
	err := a.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRestores).Put(u64key(index), u64key(uint64(at.UnixNano())))
	})
	if err != nil {
		return fmt.Errorf("archive: note restore at %d: %w", index, err)
	}
	return nil
}

// Restores lists the snapshot indexes this node restored from, ascending.
func (a *Archive) Restores() ([]uint64, error) {
	var out []uint64
	err := a.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRestores)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, _ []byte) error {
			if len(k) == 8 {
				out = append(out, binary.BigEndian.Uint64(k))
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("archive: restores: %w", err)
	}
	return out, nil
}

// FirstIndex is the lowest stored record index (0 when empty).
func (a *Archive) FirstIndex() (uint64, error) { return a.edgeIndex(true) }

// LastIndex is the highest stored record index (0 when empty).
func (a *Archive) LastIndex() (uint64, error) { return a.edgeIndex(false) }

func (a *Archive) edgeIndex(first bool) (uint64, error) {
	var idx uint64
	err := a.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRecords)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		var k []byte
		if first {
			k, _ = c.First()
		} else {
			k, _ = c.Last()
		}
		if len(k) == 8 {
			idx = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("archive: index bounds: %w", err)
	}
	return idx, nil
}

// Events is the number of events (proposals) currently held.
func (a *Archive) Events() (uint64, error) {
	var n uint64
	err := a.db.View(func(tx *bolt.Tx) error {
		n = metaU64(tx.Bucket(bucketMeta), metaEvents)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("archive: events: %w", err)
	}
	return n, nil
}

// Trimmed is the range of indexes retention has removed ((0, 0) if none).
func (a *Archive) Trimmed() (from, to uint64, err error) {
	err = a.db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		from, to = metaU64(meta, metaTrimmedFrom), metaU64(meta, metaTrimmedTo)
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("archive: trimmed range: %w", err)
	}
	return from, to, nil
}

// Get returns the record at index.
func (a *Archive) Get(index uint64) (Record, bool, error) {
	var (
		r     Record
		found bool
	)
	err := a.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketRecords)
		if b == nil {
			return nil
		}
		v := b.Get(u64key(index))
		if v == nil {
			return nil
		}
		rec, _, err := decodeRecord(index, v)
		if err != nil {
			return err
		}
		r, found = cloneRecord(rec), true
		return nil
	})
	if err != nil {
		return Record{}, false, fmt.Errorf("archive: get %d: %w", index, err)
	}
	return r, found, nil
}

// rangeChunk bounds the records read per read transaction by Range: a long
// read transaction would block the writer from growing the file.
const rangeChunk = 1024

// Range calls fn for every stored record with from ≤ index ≤ to (to = 0:
// through the last), in index order, stopping at fn's first error (returned
// as is). Records are copies fn may keep.
func (a *Archive) Range(from, to uint64, fn func(Record) error) error {
	next := from
	for {
		var batch []Record
		err := a.db.View(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketRecords)
			if b == nil {
				return nil
			}
			c := b.Cursor()
			for k, v := c.Seek(u64key(next)); k != nil && len(batch) < rangeChunk; k, v = c.Next() {
				idx := binary.BigEndian.Uint64(k)
				if to != 0 && idx > to {
					break
				}
				rec, _, err := decodeRecord(idx, v)
				if err != nil {
					return err
				}
				batch = append(batch, cloneRecord(rec))
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("archive: range %d..%d: %w", from, to, err)
		}
		for _, r := range batch {
			if err := fn(r); err != nil {
				return err
			}
		}
		if len(batch) < rangeChunk {
			return nil
		}
		next = batch[len(batch)-1].Index + 1
		if next == 0 { // wrapped: nothing beyond MaxUint64
			return nil
		}
	}
}

// HistoryIndexes lists the indexes of the records naming (fleet, key), in
// order: a prefix scan of the per-key index.
func (a *Archive) HistoryIndexes(f fsm.Fleet, key string) ([]uint64, error) {
	var out []uint64
	prefix := keyPrefix(f, key)
	err := a.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketKeys)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			if len(k) != len(prefix)+8 {
				continue // a longer key sharing the prefix cannot happen (length-prefixed), but be strict
			}
			out = append(out, binary.BigEndian.Uint64(k[len(prefix):]))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("archive: history %s/%q: %w", f, key, err)
	}
	return out, nil
}

// History returns the records naming (fleet, key): events whose keys include
// it and records whose apply evicted it, in log order.
func (a *Archive) History(f fsm.Fleet, key string) ([]Record, error) {
	out, err := a.indexedRecords(bucketKeys, keyPrefix(f, key))
	if err != nil {
		return nil, fmt.Errorf("archive: history %s/%q: %w", f, key, err)
	}
	return out, nil
}

// LinkIndexFrom reports from which index the archive indexes Link events
// by root: records at or above from are found by Links; older ones (an
// archive written before the index existed) only by reading them. ok is
// false when the archive has no links index at all.
func (a *Archive) LinkIndexFrom() (from uint64, ok bool, err error) {
	err = a.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketLinks) == nil {
			return nil
		}
		from, ok = metaU64(tx.Bucket(bucketMeta), metaLinksFrom), true
		if from == 0 {
			from = 1
		}
		return nil
	})
	if err != nil {
		return 0, false, fmt.Errorf("archive: links index: %w", err)
	}
	return from, ok, nil
}

// Links returns the records holding a Link event whose root is root, in log
// order (from the links index: records below LinkIndexFrom are not found).
func (a *Archive) Links(root string) ([]Record, error) {
	out, err := a.indexedRecords(bucketLinks, linkPrefix(root))
	if err != nil {
		return nil, fmt.Errorf("archive: links to %q: %w", root, err)
	}
	return out, nil
}

// indexedRecords reads, in log order, the records an index bucket lists
// under prefix (its keys are prefix | record index u64 BE).
func (a *Archive) indexedRecords(index, prefix []byte) ([]Record, error) {
	var out []Record
	err := a.db.View(func(tx *bolt.Tx) error {
		ib, rb := tx.Bucket(index), tx.Bucket(bucketRecords)
		if ib == nil || rb == nil {
			return nil
		}
		c := ib.Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			if len(k) != len(prefix)+8 {
				continue
			}
			idx := binary.BigEndian.Uint64(k[len(prefix):])
			v := rb.Get(k[len(prefix):])
			if v == nil {
				continue // index and record are trimmed in one transaction; stay defensive
			}
			rec, _, err := decodeRecord(idx, v)
			if err != nil {
				return err
			}
			out = append(out, cloneRecord(rec))
		}
		return nil
	})
	return out, err
}

func (a *Archive) trimLoop(ctx context.Context) {
	defer close(a.done)
	t := time.NewTicker(a.opts.TrimInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.kick:
		}
		if _, err := a.Trim(ctx); err != nil && !errors.Is(err, context.Canceled) {
			a.log.Warn("archive trim failed", "path", a.path, "err", err)
		}
	}
}

// Trim applies the retention limits now, in transactions of at most
// TrimBatch records, and returns how many records it removed. The
// background trimmer calls it; tests and tools may too.
func (a *Archive) Trim(ctx context.Context) (int, error) {
	if a.opts.ReadOnly {
		return 0, fmt.Errorf("archive: trim %s: opened read-only", a.path)
	}
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := a.trimOnce()
		total += n
		if err != nil {
			return total, fmt.Errorf("archive: trim: %w", err)
		}
		if n < a.opts.TrimBatch {
			return total, nil
		}
	}
}

// trimOnce deletes up to TrimBatch of the oldest records that violate a
// limit, with their per-key index entries, in one transaction.
func (a *Archive) trimOnce() (int, error) {
	removed := 0
	err := a.db.Update(func(tx *bolt.Tx) error {
		recs, keys, meta, links := tx.Bucket(bucketRecords), tx.Bucket(bucketKeys), tx.Bucket(bucketMeta), tx.Bucket(bucketLinks)
		events := metaU64(meta, metaEvents)
		c := recs.Cursor()
		var cutoff int64
		hasCutoff := false
		if a.opts.MaxAge > 0 {
			if _, v := c.Last(); v != nil {
				newest, _, err := decodeRecordHeader(v)
				if err != nil {
					return err
				}
				cutoff, hasCutoff = newest-int64(a.opts.MaxAge), true
			}
		}
		var first, last uint64
		var toDelete [][]byte
		for k, v := c.First(); k != nil && len(toDelete) < a.opts.TrimBatch; k, v = c.Next() {
			idx := binary.BigEndian.Uint64(k)
			rec, n, err := decodeRecord(idx, v)
			if err != nil {
				return err
			}
			tooMany := a.opts.MaxEvents > 0 && events > a.opts.MaxEvents
			tooOld := hasCutoff && rec.Time < cutoff
			if !tooMany && !tooOld {
				break
			}
			terms := rec.indexTerms()
			for _, fk := range terms.keys {
				if err := keys.Delete(keyIndexKey(fk, idx)); err != nil {
					return fmt.Errorf("unindex record %d: %w", idx, err)
				}
			}
			for _, root := range terms.roots {
				if err := links.Delete(linkIndexKey(root, idx)); err != nil {
					return fmt.Errorf("unindex links of record %d: %w", idx, err)
				}
			}
			toDelete = append(toDelete, append([]byte(nil), k...))
			if uint64(n) <= events {
				events -= uint64(n)
			} else {
				events = 0
			}
			if first == 0 {
				first = idx
			}
			last = idx
		}
		for _, k := range toDelete {
			if err := recs.Delete(k); err != nil {
				return fmt.Errorf("delete record: %w", err)
			}
		}
		removed = len(toDelete)
		if removed == 0 {
			return nil
		}
		if metaU64(meta, metaTrimmedFrom) == 0 {
			if err := putMetaU64(meta, metaTrimmedFrom, first); err != nil {
				return err
			}
		}
		if last > metaU64(meta, metaTrimmedTo) {
			if err := putMetaU64(meta, metaTrimmedTo, last); err != nil {
				return err
			}
		}
		return putMetaU64(meta, metaEvents, events)
	})
	return removed, err
}
