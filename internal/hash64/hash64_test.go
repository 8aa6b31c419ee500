package hash64

import (
	"hash/fnv"
	"testing"
)

// The functions are formats: their values are pinned, and FNV1a is the
// standard library's FNV-1a.
func TestValuesArePinned(t *testing.T) {
	for _, s := range []string{"", "a", "conversation-1", "ctx-0"} {
		h := fnv.New64a()
		h.Write([]byte(s))
		if got := FNV1a(s); got != h.Sum64() {
			t.Errorf("FNV1a(%q) = %#x, hash/fnv says %#x", s, got, h.Sum64())
		}
	}
	if got := FNV1aWords([]uint32{1, 2, 300}); got != 0xd0ab3f18672e6d32 {
		t.Errorf("FNV1aWords = %#x", got)
	}
	// The value every derived hash (rendezvous weights, the state trie)
	// has been computed with.
	if got := Mix64(1); got != 0x5692161d100b05e5 {
		t.Errorf("Mix64(1) = %#x", got)
	}
}
