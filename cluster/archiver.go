package cluster

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-project/tether/cluster/archive"
)

// archiverQueue bounds the apply batches waiting for the archive; apply
// blocks (backpressure) beyond it.
const archiverQueue = 256

// archiver writes applied entries to the archive off the apply path: the
// FSM goroutine publishes the state and answers proposers, then queues the
// batch here, so an archive fsync never sits between a commit and its
// answer. Queued batches are merged (up to archiverLinger) into one bbolt
// transaction.
//
// Nothing is lost by answering first: a raft snapshot is persisted only
// after the archive holds every entry up to the snapshot's index
// (waitArchived in Persist), so after a crash raft replays, and re-archives,
// everything the archive might have missed.
type archiver struct {
	a       *archive.Archive
	in      chan []archive.Record
	onError func(error) // the archive failed: the node halts

	archived atomic.Uint64 // highest index written
	failed   atomic.Pointer[error]
	aborted  atomic.Bool
	mu       sync.Mutex
	changed  chan struct{} // closed and replaced when archived or failed moves
	flushNow chan struct{} // a waiter wants queued records written now
	done     chan struct{}
}

func newArchiver(a *archive.Archive, onError func(error)) (*archiver, error) {
	last, err := a.LastIndex()
	if err != nil {
		return nil, err
	}
	ar := &archiver{
		a: a, in: make(chan []archive.Record, archiverQueue), onError: onError,
		changed: make(chan struct{}), flushNow: make(chan struct{}, 1), done: make(chan struct{}),
	}
	ar.archived.Store(last)
	go ar.run()
	return ar, nil
}

// restored notes a state restored from a snapshot at index: the archive
// deliberately lacks what the snapshot compacted (see NoteRestore), so
// snapshots at or below it need not wait for those entries.
func (ar *archiver) restored(index uint64) {
	for {
		cur := ar.archived.Load()
		if cur >= index || ar.archived.CompareAndSwap(cur, index) {
			break
		}
	}
	ar.notify()
}

// enqueue hands a batch over (FSM goroutine only).
func (ar *archiver) enqueue(recs []archive.Record) {
	if len(recs) > 0 {
		ar.in <- recs
	}
}

// archiverLinger is how long queued records may wait for company before
// they are written: on this class of machine an fsync costs CPU, and the
// archive is off the proposal path, so fewer, larger transactions win.
// Anyone who needs the archive current (snapshot persistence, WaitArchived)
// asks for an immediate flush.
const (
	archiverLinger   = 10 * time.Millisecond
	archiverMaxBatch = 8192
)

func (ar *archiver) run() {
	defer close(ar.done)
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	for recs := range ar.in {
		linger.Reset(archiverLinger)
	collect:
		for len(recs) < archiverMaxBatch {
			select {
			case more, ok := <-ar.in:
				if !ok {
					break collect
				}
				recs = append(recs, more...)
			case <-ar.flushNow:
				// Take what is already queued, then write.
				for len(recs) < archiverMaxBatch {
					select {
					case more, ok := <-ar.in:
						if !ok {
							break collect
						}
						recs = append(recs, more...)
						continue
					default:
					}
					break collect
				}
			case <-linger.C:
				break collect
			}
		}
		linger.Stop()
		if ar.failed.Load() != nil || ar.aborted.Load() {
			continue // drain: the node is halting, or dying
		}
		if err := ar.a.Append(recs); err != nil {
			err = fmt.Errorf("cluster: archive entries %d..%d: %w", recs[0].Index, recs[len(recs)-1].Index, err)
			ar.failed.Store(&err)
			ar.notify()
			ar.onError(err)
			continue
		}
		last := recs[len(recs)-1].Index
		for {
			cur := ar.archived.Load()
			if cur >= last || ar.archived.CompareAndSwap(cur, last) {
				break
			}
		}
		ar.notify()
	}
}

func (ar *archiver) notify() {
	ar.mu.Lock()
	close(ar.changed)
	ar.changed = make(chan struct{})
	ar.mu.Unlock()
}

func (ar *archiver) err() error {
	if p := ar.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// waitArchived blocks until the archive holds index (or the archiver failed
// or timeout passed).
func (ar *archiver) waitArchived(index uint64, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		ar.mu.Lock()
		ch := ar.changed
		ar.mu.Unlock()
		if err := ar.err(); err != nil {
			return err
		}
		if ar.archived.Load() >= index {
			return nil
		}
		select {
		case ar.flushNow <- struct{}{}:
		default:
		}
		select {
		case <-ch:
		case <-ar.done:
			if ar.archived.Load() >= index {
				return nil
			}
			return fmt.Errorf("cluster: archiver stopped at index %d before %d", ar.archived.Load(), index)
		case <-deadline.C:
			return fmt.Errorf("cluster: archive did not reach index %d within %s (at %d)", index, timeout, ar.archived.Load())
		}
	}
}

// close flushes the queue and stops (after raft's FSM goroutine stopped).
func (ar *archiver) close() {
	close(ar.in)
	<-ar.done
}

// abort stops without writing what is queued, as a crash would (Kill).
func (ar *archiver) abort() {
	ar.aborted.Store(true)
	ar.close()
}
