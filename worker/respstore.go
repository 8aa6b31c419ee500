package worker

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
)

// respStore is the Responses API store of this worker process: stored
// responses (their object, the conversation to continue from, the input
// items), and for a background response its stream's events. A stored
// response exists only here — as in vLLM, whose OpenAIServingResponses
// keeps response_store, msg_store and event_store in the API server
// process (vllm/entrypoints/openai/responses/serving.py) — so a request
// naming it on another worker is a 404 there. Bounded in entries and bytes,
// least recently used evicted first, each eviction logged.
type respStore struct {
	mu    sync.Mutex
	resps *lruMap[*storedResponse]
	// items maps the id of each input and output item of a stored
	// response to the response (an item_reference resolves by it).
	items   map[string]string
	log     *slog.Logger
	evicted func()
}

// storedResponse is one response. Its fields change under the store's lock.
type storedResponse struct {
	id      string
	status  string          // queued, in_progress, completed, incomplete, cancelled, failed
	object  json.RawMessage // the response object as last written
	history []json.RawMessage
	// itemIDs are the item ids the store indexed it under (itemIDs).
	itemIDs []string
	input   []json.RawMessage // input items, with ids
	// chain is the rank-placement key of the conversation the response
	// belongs to: its conversation id, or the first response of a chain
	// of previous_response_ids that named none (a continuation then runs
	// on the rank that holds the chain's KV).
	chain string

	background bool
	cancel     context.CancelFunc // a background run's
	// events of a background response's stream (SSE name and data), and
	// a channel closed (and replaced) on each append; done once the last
	// event is in.
	events  []storedEvent
	changed chan struct{}
	done    bool
}

type storedEvent struct {
	name string
	data []byte
}

func newRespStore(maxEntries int, maxBytes int64, log *slog.Logger, evicted func()) *respStore {
	return &respStore{resps: newLRUMap[*storedResponse](maxEntries, maxBytes), items: map[string]string{}, log: log, evicted: evicted}
}

// put stores (or replaces) r.
func (s *respStore) put(r *storedResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.putLocked(r)
}

func (s *respStore) putLocked(r *storedResponse) {
	if old, ok := s.resps.get(r.id); ok {
		s.forget(old)
	}
	r.itemIDs = itemIDs(r)
	for _, id := range r.itemIDs {
		s.items[id] = r.id
	}
	s.resps.put(r.id, r, r.storeSize())
	s.resps.evict(1, func(old *storedResponse, size int64) {
		s.forget(old)
		old.stop()
		s.log.Info("evicted a stored response (responses_store_entries / responses_store_bytes)", "response_id", old.id,
			"status", old.status, "bytes", size, "entries", s.resps.len(), "store_bytes", s.resps.bytes)
		if s.evicted != nil {
			s.evicted()
		}
	})
}

// forget drops r's items from the index (r left the store, or is being
// replaced).
func (s *respStore) forget(r *storedResponse) {
	for _, id := range r.itemIDs {
		if s.items[id] == r.id {
			delete(s.items, id)
		}
	}
}

// itemIDs are the ids of r's input items and of its object's output items.
func itemIDs(r *storedResponse) []string {
	var ids []string
	for _, in := range r.input {
		if id := itemIDOf(in); id != "" {
			ids = append(ids, id)
		}
	}
	var obj struct {
		Output []json.RawMessage `json:"output"`
	}
	_ = json.Unmarshal(r.object, &obj)
	for _, out := range obj.Output {
		if id := itemIDOf(out); id != "" {
			ids = append(ids, id)
		}
	}
	return ids
}

// storeSize is what the response counts against responses_store_bytes.
func (r *storedResponse) storeSize() int64 {
	n := int64(len(r.object)) + 256
	for _, h := range r.history {
		n += int64(len(h))
	}
	for _, in := range r.input {
		n += int64(len(in))
	}
	for _, ev := range r.events {
		n += int64(len(ev.data))
	}
	return n
}

// stop cancels a background run that has not ended: its response left
// the store.
func (r *storedResponse) stop() {
	if r.cancel != nil && !r.done {
		r.cancel()
	}
}

// get returns the response and marks it used.
func (s *respStore) get(id string) (*storedResponse, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resps.get(id)
}

// snapshot reads r's fields under the lock.
func (s *respStore) snapshot(r *storedResponse) (status string, object json.RawMessage, history, input []json.RawMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return r.status, r.object, r.history, r.input
}

func (s *respStore) delete(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.resps.remove(id)
	if ok {
		s.forget(r)
		r.stop()
	}
	return ok
}

// update changes a stored response's status and object (a no-op once
// it was cancelled, or after it left the store).
func (s *respStore) update(r *storedResponse, status string, object json.RawMessage, history []json.RawMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.status == "cancelled" {
		return
	}
	r.status, r.object = status, object
	if history != nil {
		r.history = history
	}
	if _, ok := s.resps.get(r.id); ok {
		s.putLocked(r)
	}
}

// appendEvent adds one event of a background stream; last marks the end.
func (s *respStore) appendEvent(r *storedResponse, name string, data []byte, last bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.done {
		return
	}
	r.events = append(r.events, storedEvent{name, data})
	s.resps.resize(r.id, r.storeSize())
	r.done = last
	close(r.changed)
	r.changed = make(chan struct{})
}

// eventsAfter returns the events from index i, whether the stream ended,
// and a channel closed when more arrive.
func (s *respStore) eventsAfter(r *storedResponse, i int) ([]storedEvent, bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []storedEvent
	if i < len(r.events) {
		out = append(out, r.events[i:]...)
	}
	return out, r.done, r.changed
}

// cancelRun cancels a queued or in-progress background response and
// returns its object; a background response that already ended (finished,
// failed or cancelled before) is returned as it is, as OpenAI answers a
// second cancel. ok is false for a response that did not run in the
// background, which no cancel applies to.
func (s *respStore) cancelRun(r *storedResponse, object func(status string) json.RawMessage) (json.RawMessage, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !r.background {
		return nil, false
	}
	if r.status != "queued" && r.status != "in_progress" {
		return r.object, true
	}
	r.status = "cancelled"
	r.object = object("cancelled")
	if r.cancel != nil {
		r.cancel()
	}
	return r.object, true
}

// item finds an input or output item of a stored response by its id (an
// item_reference), through the index of item ids.
func (s *respStore) item(id string) (json.RawMessage, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.resps.get(s.items[id])
	if !ok {
		return nil, false
	}
	for _, in := range r.input {
		if itemIDOf(in) == id {
			return in, true
		}
	}
	var obj struct {
		Output []json.RawMessage `json:"output"`
	}
	_ = json.Unmarshal(r.object, &obj)
	for _, out := range obj.Output {
		if itemIDOf(out) == id {
			return out, true
		}
	}
	return nil, false
}

// stats returns the entries and bytes held.
func (s *respStore) stats() (int, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resps.len(), s.resps.bytes
}
