package routing

import "github.com/tether-project/tether/internal/hash64"

// Rendezvous (highest-random-weight) hashing: every (key, instance) pair gets
// a pseudo-random weight and the key goes to the instance with the highest
// one. Every edge computes the same weights without coordination, keys
// spread evenly, and adding or removing an instance moves only the keys that
// instance wins or held (about 1/n of them). The hash is fixed and seedless
// (FNV-1a then a SplitMix64 finalizer): changing it moves every degraded-mode
// and tie-broken placement, so it is part of the routing contract.

// KeyHash is the rendezvous hash of a routing key.
func KeyHash(key string) uint64 { return hash64.Mix64(hash64.FNV1a(key)) }

// SpreadFor derives the tie-break value of an unkeyed request from something
// unique to it (its request id), so unkeyed requests spread too.
func SpreadFor(requestID string) uint64 { return KeyHash(requestID) }

// rendezvousWeight is the weight of instance id for a key whose KeyHash is
// keyHash.
func rendezvousWeight(keyHash uint64, id string) uint64 {
	return hash64.Mix64(keyHash ^ hash64.Mix64(hash64.FNV1a(id)+0x9e3779b97f4a7c15))
}

// Rendezvous returns the instance among ids that key maps to ("" when ids
// is empty). Ties (astronomically rare) go to the smaller id.
func Rendezvous(key string, ids []string) string {
	kh := KeyHash(key)
	best, bestW := "", uint64(0)
	for _, id := range ids {
		w := rendezvousWeight(kh, id)
		if best == "" || w > bestW || (w == bestW && id < best) {
			best, bestW = id, w
		}
	}
	return best
}
