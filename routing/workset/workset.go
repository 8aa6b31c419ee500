// Package workset remembers what the edges routed lately: for each
// conversation an edge sent a request of within a window (its own, and
// those the other edges told it), the instance it went to and the prompt's
// length in KV blocks. Summed per instance, that is the
// working set the instance's prefix cache must hold for those
// conversations to keep hitting — what its queue and hit rate do not show
// yet, and what a new prompt placed there competes with.
//
// It reads no clock and does no I/O: time is a parameter. Memory is
// bounded (Config.MaxKeys); the least recently noted conversation is
// forgotten first. Safe for concurrent use.
package workset

import (
	"container/list"
	"sync"
	"time"
)

// DefaultWindow is how long a conversation counts after its last request.
const DefaultWindow = 2 * time.Minute

// DefaultMaxKeys bounds the conversations remembered (about 100 bytes
// each beside their ids).
const DefaultMaxKeys = 1 << 16

// Config sizes a Set. Zero fields take the defaults.
type Config struct {
	Window  time.Duration
	MaxKeys int
}

// Load is one instance's working set: the conversations last sent there
// within the window, and their prompts' blocks.
type Load struct {
	Keys   int
	Blocks int64
}

// Set is the remembered working sets. The zero value is not usable; call
// New.
type Set struct {
	window int64
	max    int

	mu   sync.Mutex
	keys map[string]*list.Element // of *entry
	// order holds the entries from the least recently noted (front) to
	// the most recent (back).
	order list.List
	inst  map[string]*Load
}

type entry struct {
	key, instance string
	blocks        int
	at            int64
}

// New returns an empty Set.
func New(cfg Config) *Set {
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	return &Set{window: int64(cfg.Window), max: cfg.MaxKeys, keys: map[string]*list.Element{}, inst: map[string]*Load{}}
}

// Note records that key's request, a prompt of blocks KV blocks, went to
// instance at now. A conversation counts on one instance: the last it was
// sent to. An empty key or instance is ignored.
func (s *Set) Note(key, instance string, blocks int, now time.Time) {
	if key == "" || instance == "" {
		return
	}
	t := now.UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(t)
	el := s.keys[key]
	if el == nil {
		if len(s.keys) >= s.max && s.order.Len() > 0 {
			s.drop(s.order.Front())
		}
		el = s.order.PushBack(&entry{key: key})
		s.keys[key] = el
	} else {
		s.sub(el.Value.(*entry))
		s.order.MoveToBack(el)
	}
	e := el.Value.(*entry)
	e.instance, e.blocks, e.at = instance, max(blocks, 0), max(t, e.at)
	s.add(e)
}

// Load returns instance's working set at now.
func (s *Set) Load(instance string, now time.Time) Load {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(now.UnixNano())
	if l := s.inst[instance]; l != nil {
		return *l
	}
	return Load{}
}

// Key returns the instance key was last sent to within the window, and its
// prompt's blocks then.
func (s *Set) Key(key string, now time.Time) (instance string, blocks int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(now.UnixNano())
	el := s.keys[key]
	if el == nil {
		return "", 0, false
	}
	e := el.Value.(*entry)
	return e.instance, e.blocks, true
}

// Len is the number of conversations remembered.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

// expire forgets the entries last noted before t − window. Entries are
// kept in the order they were noted; one noted with an earlier time than
// the one before it (concurrent requests) waits for that one.
func (s *Set) expire(t int64) {
	for el := s.order.Front(); el != nil && el.Value.(*entry).at < t-s.window; el = s.order.Front() {
		s.drop(el)
	}
}

func (s *Set) drop(el *list.Element) {
	e := s.order.Remove(el).(*entry)
	s.sub(e)
	delete(s.keys, e.key)
}

func (s *Set) add(e *entry) {
	l := s.inst[e.instance]
	if l == nil {
		l = &Load{}
		s.inst[e.instance] = l
	}
	l.Keys++
	l.Blocks += int64(e.blocks)
}

func (s *Set) sub(e *entry) {
	l := s.inst[e.instance]
	if l == nil {
		return
	}
	l.Keys--
	l.Blocks -= int64(e.blocks)
	if l.Keys <= 0 {
		delete(s.inst, e.instance)
	}
}
