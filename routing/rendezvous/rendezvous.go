// Package rendezvous is highest-random-weight hashing: every (key,
// instance) pair gets a pseudo-random weight, and among instances of equal
// merit a key prefers the one with the highest weight. Every edge computes
// the same weights without coordination, keys spread evenly, and adding or
// removing an instance changes only the preferences of the keys that
// instance wins or held (about 1/n of them). The hash is fixed and seedless
// (FNV-1a then a SplitMix64 finalizer): changing it moves every tie-broken
// placement, so it is part of the routing contract.
package rendezvous

import "github.com/tether-project/tether/internal/hash64"

// KeyHash is the rendezvous hash of a routing key.
func KeyHash(key string) uint64 { return hash64.Mix64(hash64.FNV1a(key)) }

// Weight is the weight of instance id for a key whose KeyHash is keyHash.
func Weight(keyHash uint64, id string) uint64 {
	return hash64.Mix64(keyHash ^ hash64.Mix64(hash64.FNV1a(id)+0x9e3779b97f4a7c15))
}
