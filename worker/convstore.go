package worker

import (
	"encoding/json"
	"log/slog"
	"sync"
)

// convStore holds the Conversations API's conversations of this worker
// process: each one's metadata and items, in order. A conversation lives
// only here (the edge routes every request naming it to this process:
// edge/DESIGN.md "Conversations"); a proxy worker keeps its own, since
// vLLM and SGLang serve no Conversations API. Bounded like the response
// store, by responses_store_entries conversations and
// responses_store_bytes of their items, least recently used evicted
// first, each eviction logged and counted.
type convStore struct {
	mu      sync.Mutex
	convs   *lruMap[*conversation]
	log     *slog.Logger
	evicted func()
}

// conversation is one conversation; its fields change under the store's
// lock, and readers get copies (convSnapshot).
type conversation struct {
	id       string
	created  int64
	metadata json.RawMessage // an object
	items    []json.RawMessage
}

// convSnapshot is a conversation as read at one moment.
type convSnapshot struct {
	id       string
	created  int64
	metadata json.RawMessage
	items    []json.RawMessage
}

func newConvStore(maxEntries int, maxBytes int64, log *slog.Logger, evicted func()) *convStore {
	return &convStore{convs: newLRUMap[*conversation](maxEntries, maxBytes), log: log, evicted: evicted}
}

// size is what the conversation counts against responses_store_bytes.
func (c *conversation) size() int64 {
	n := int64(len(c.metadata)) + 128
	for _, it := range c.items {
		n += int64(len(it))
	}
	return n
}

func (c *conversation) snapshot() convSnapshot {
	return convSnapshot{id: c.id, created: c.created, metadata: c.metadata, items: append([]json.RawMessage(nil), c.items...)}
}

// create stores a new conversation.
func (s *convStore) create(id string, created int64, metadata json.RawMessage, items []json.RawMessage) convSnapshot {
	c := &conversation{id: id, created: created, metadata: metadata, items: items}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.convs.put(id, c, c.size())
	s.evictLocked()
	return c.snapshot()
}

// evictLocked drops the least recently used conversations beyond the
// bounds (never the last one: a single conversation over the byte bound
// stays, as the response store keeps its last response).
func (s *convStore) evictLocked() {
	s.convs.evict(1, func(old *conversation, size int64) {
		s.log.Info("evicted a conversation (responses_store_entries / responses_store_bytes)", "conversation_id", old.id,
			"items", len(old.items), "bytes", size, "conversations", s.convs.len(), "store_bytes", s.convs.bytes)
		if s.evicted != nil {
			s.evicted()
		}
	})
}

// with runs f on conversation id (marked used) under the lock and
// returns its snapshot afterwards; ok false when the store does not hold
// it.
func (s *convStore) with(id string, f func(c *conversation)) (convSnapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.convs.get(id)
	if !ok {
		return convSnapshot{}, false
	}
	if f != nil {
		f(c)
		s.convs.resize(id, c.size())
		snap := c.snapshot()
		s.evictLocked()
		return snap, true
	}
	return c.snapshot(), true
}

// get reads a conversation.
func (s *convStore) get(id string) (convSnapshot, bool) { return s.with(id, nil) }

// appendItems adds items at the end of conversation id.
func (s *convStore) appendItems(id string, items []json.RawMessage) bool {
	_, ok := s.with(id, func(c *conversation) { c.items = append(c.items, items...) })
	return ok
}

// setMetadata replaces conversation id's metadata.
func (s *convStore) setMetadata(id string, metadata json.RawMessage) (convSnapshot, bool) {
	return s.with(id, func(c *conversation) { c.metadata = metadata })
}

// deleteItem removes item itemID from conversation id; found reports
// whether the conversation held it.
func (s *convStore) deleteItem(id, itemID string) (snap convSnapshot, ok, found bool) {
	snap, ok = s.with(id, func(c *conversation) {
		for i, it := range c.items {
			if itemID != "" && itemIDOf(it) == itemID {
				c.items = append(c.items[:i:i], c.items[i+1:]...)
				found = true
				return
			}
		}
	})
	return snap, ok, found
}

// delete removes conversation id.
func (s *convStore) delete(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.convs.remove(id)
	return ok
}

// stats returns the conversations and bytes held.
func (s *convStore) stats() (int, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.convs.len(), s.convs.bytes
}

// itemIDOf is an item's id ("" none).
func itemIDOf(item json.RawMessage) string {
	var v struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(item, &v)
	return v.ID
}
