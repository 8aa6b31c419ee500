// Package hash64 holds tether's fixed, seedless 64-bit hash functions:
// FNV-1a and the SplitMix64 finalizer. They are part of formats and
// contracts (rendezvous placement, the state trie's key hash, simulated
// outputs, trace key derivation): changing one moves every value derived
// from it, so there is exactly one copy of each.
package hash64

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// FNV1a is 64-bit FNV-1a over the bytes of s.
func FNV1a(s string) uint64 {
	h := uint64(fnvOffset)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}

// FNV1aWords is 64-bit FNV-1a over words, one word per step (token ids).
func FNV1aWords(words []uint32) uint64 {
	h := uint64(fnvOffset)
	for _, w := range words {
		h ^= uint64(w)
		h *= fnvPrime
	}
	return h
}

// Mix64 is the SplitMix64 finalizer: a bijection that spreads every input
// bit over the output.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
