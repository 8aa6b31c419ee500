package workset

import (
	"fmt"
	"testing"
	"time"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func TestLoadSumsTheConversationsLastSentThere(t *testing.T) {
	s := New(Config{Window: time.Minute})
	s.Note("a", "i1", 100, t0)
	s.Note("b", "i1", 50, t0.Add(time.Second))
	s.Note("c", "i2", 10, t0.Add(2*time.Second))
	if got := s.Load("i1", t0.Add(3*time.Second)); got != (Load{Keys: 2, Blocks: 150}) {
		t.Fatalf("i1 = %+v, want 2 keys, 150 blocks", got)
	}
	// a's next turn, longer, went to i2: it counts there only.
	s.Note("a", "i2", 120, t0.Add(4*time.Second))
	if got := s.Load("i1", t0.Add(5*time.Second)); got != (Load{Keys: 1, Blocks: 50}) {
		t.Fatalf("i1 after a moved = %+v, want 1 key, 50 blocks", got)
	}
	if got := s.Load("i2", t0.Add(5*time.Second)); got != (Load{Keys: 2, Blocks: 130}) {
		t.Fatalf("i2 after a moved = %+v, want 2 keys, 130 blocks", got)
	}
	if inst, blocks, ok := s.Key("a", t0.Add(5*time.Second)); !ok || inst != "i2" || blocks != 120 {
		t.Fatalf("Key(a) = %q, %d, %v; want i2, 120, true", inst, blocks, ok)
	}
}

func TestConversationsIdleLongerThanTheWindowAreForgotten(t *testing.T) {
	s := New(Config{Window: time.Minute})
	s.Note("a", "i1", 100, t0)
	s.Note("b", "i1", 50, t0.Add(30*time.Second))
	if got := s.Load("i1", t0.Add(61*time.Second)); got != (Load{Keys: 1, Blocks: 50}) {
		t.Fatalf("after a's window = %+v, want b only", got)
	}
	if _, _, ok := s.Key("a", t0.Add(61*time.Second)); ok {
		t.Fatal("a is still remembered after its window")
	}
	if got := s.Load("i1", t0.Add(91*time.Second)); got != (Load{}) {
		t.Fatalf("after both windows = %+v, want empty", got)
	}
	if s.Len() != 0 {
		t.Fatalf("Len = %d after every window ended, want 0", s.Len())
	}
}

func TestMemoryIsBounded(t *testing.T) {
	s := New(Config{Window: time.Hour, MaxKeys: 3})
	for i := range 10 {
		s.Note(fmt.Sprint("k", i), "i1", 1, t0.Add(time.Duration(i)*time.Second))
	}
	if s.Len() != 3 {
		t.Fatalf("Len = %d, want the bound 3", s.Len())
	}
	if got := s.Load("i1", t0.Add(time.Minute)); got != (Load{Keys: 3, Blocks: 3}) {
		t.Fatalf("Load = %+v, want the 3 most recent", got)
	}
	if _, _, ok := s.Key("k9", t0.Add(time.Minute)); !ok {
		t.Fatal("the most recent key was dropped")
	}
	if _, _, ok := s.Key("k0", t0.Add(time.Minute)); ok {
		t.Fatal("the oldest key was kept beyond the bound")
	}
}

func TestEmptyKeysAndNegativeLengthsAreHarmless(t *testing.T) {
	s := New(Config{})
	s.Note("", "i1", 10, t0)
	s.Note("a", "", 10, t0)
	s.Note("b", "i1", -5, t0)
	if got := s.Load("i1", t0); got != (Load{Keys: 1, Blocks: 0}) {
		t.Fatalf("Load = %+v, want b with 0 blocks", got)
	}
}
