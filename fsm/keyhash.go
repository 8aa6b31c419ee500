package fsm

import (
	"math/bits"
	"sync/atomic"

	"github.com/tether-project/tether/internal/hash64"
)

// hashKey is the fixed, seedless 64-bit hash that places keys in the state's
// hash tries. It must never change between builds or machines (iteration
// order of the tries depends on it), so it is written out here instead of
// borrowing Go's seeded map hash. It is a wyhash-style multiply-fold over
// 8-byte little-endian words, finished with the splitmix64 avalanche.
func hashKey(tag uint8, s string) uint64 {
	const (
		k0 = 0xa0761d6478bd642f
		k1 = 0xe7037ed1a0b428db
		k2 = 0x8ebc6af09c88c6e3
	)
	h := k0 ^ uint64(tag)<<56 ^ uint64(len(s))
	for len(s) >= 8 {
		w := uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
			uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
		h = fold(h^w, k1)
		s = s[8:]
	}
	var w uint64
	for i := 0; i < len(s); i++ {
		w |= uint64(s[i]) << (8 * i)
	}
	h = fold(h^w, k2)
	// The SplitMix64 finaliser: every input bit affects every output bit,
	// so the 5-bit chunks the trie consumes are all well mixed.
	return hash64.Mix64(h)
}

func fold(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo ^ a
}

// txnCounter hands out transaction owner ids, process-wide so that trie nodes
// built by one machine (or by ReadSnapshot) are never mistaken for nodes
// another machine's transaction may mutate in place. 0 is never handed out.
var txnCounter atomic.Uint64

func newOwner() uint64 { return txnCounter.Add(1) }
