package proposals

import (
	"sync"

	"github.com/tether-project/tether/fsm"
)

// answers batches the engines' answers about their prefix caches
// (fsm.CacheAnswers) for the recorder: one event per touch interval (the
// touches' flush hands the batch over; at least every answersInterval), or
// at once when a batch is full.
// Nothing waits for them; a log that cannot keep up loses the oldest
// (the recorder's bounded queue).
type answers struct {
	mu    sync.Mutex
	batch []fsm.CacheAnswer
}

// maxAnswersPerEvent bounds one CacheAnswers event (65 bytes an answer
// in a tether dev run, up to about 150 with long conversation ids and
// prompts: at most a few tens of KiB an entry).
const maxAnswersPerEvent = 256

// AddAnswer queues an engine's answer for the log (off the request path).
func (r *Recorder) AddAnswer(a fsm.CacheAnswer) {
	r.answers.mu.Lock()
	r.answers.batch = append(r.answers.batch, a)
	full := len(r.answers.batch) >= maxAnswersPerEvent
	r.answers.mu.Unlock()
	if full {
		r.flushAnswers()
	}
}

// flushAnswers queues the answers gathered so far as one event.
func (r *Recorder) flushAnswers() {
	r.answers.mu.Lock()
	batch := r.answers.batch
	r.answers.batch = nil
	r.answers.mu.Unlock()
	for len(batch) > 0 {
		n := min(len(batch), maxAnswersPerEvent)
		r.Add(fsm.CacheAnswers{Edge: r.e.cfg.NodeID, Answers: batch[:n:n]}, nil)
		batch = batch[n:]
	}
}

// PendingAnswers is the answers not yet handed to the recorder.
func (r *Recorder) PendingAnswers() int {
	r.answers.mu.Lock()
	defer r.answers.mu.Unlock()
	return len(r.answers.batch)
}
