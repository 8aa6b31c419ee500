package oaiserve

import (
	"container/list"
	"crypto/sha256"
	"encoding/binary"
)

// blockHash is an engine block hash: vLLM's hash_block_tokens (SHA-256 over
// the parent's hash and the block's token ids, vllm/v1/core/kv_cache_utils.py)
// in the stand-in's own encoding. Its bytes, or its first 8 bytes as a
// signed integer, are what the KV events publish (ExternalBlockHash =
// bytes | int). A block computed under a LoRA adapter hashes the adapter's
// name too (vLLM's extra keys: _gen_lora_extra_hash_keys), so the base
// model's blocks and each adapter's are apart.
type blockHash [sha256.Size]byte

func chainBlockHash(parent *blockHash, tokens []uint32, adapter string) blockHash {
	h := sha256.New()
	if parent != nil {
		_, _ = h.Write(parent[:])
	}
	if adapter != "" {
		_, _ = h.Write([]byte("lora\x00" + adapter + "\x00"))
	}
	var b [4]byte
	for _, t := range tokens {
		binary.BigEndian.PutUint32(b[:], t)
		_, _ = h.Write(b[:])
	}
	var out blockHash
	copy(out[:], h.Sum(nil))
	return out
}

// rankCache is one rank's paged prefix cache: whole blocks keyed by their
// chained hash, evicted least recently used first when the pool is full
// (vLLM's free block queue, SGLang's radix tree eviction).
type rankCache struct {
	capacity int
	lru      *list.List // of *cachedBlock, most recent first
	byHash   map[blockHash]*list.Element
}

type cachedBlock struct {
	hash blockHash
}

// storedRun is a run of newly stored blocks chained to each other: one
// BlockStored event.
type storedRun struct {
	parent  *blockHash // nil: the run starts the prompt
	hashes  []blockHash
	tokens  []uint32
	adapter string // the LoRA adapter the blocks were computed under
}

func newRankCache(capacity int) *rankCache {
	return &rankCache{capacity: capacity, lru: list.New(), byHash: map[blockHash]*list.Element{}}
}

func (c *rankCache) len() int { return len(c.byHash) }

func (c *rankCache) clear() {
	c.lru.Init()
	clear(c.byHash)
}

// lookup counts the prompt's leading blocks already cached, then caches
// every full block (the prompt's are the most recent), evicting the least
// recently used when the pool is full. It returns the hits, the runs of
// blocks stored and the hashes evicted. adapter is the request's LoRA
// adapter ("" the base model).
func (c *rankCache) lookup(tokens []uint32, bs int, adapter string) (hit int, stored []storedRun, removed []blockHash) {
	var parent *blockHash
	leading := true
	run := -1 // index in stored of the run being extended
	for end := bs; end <= len(tokens); end += bs {
		block := tokens[end-bs : end]
		h := chainBlockHash(parent, block, adapter)
		if e, ok := c.byHash[h]; ok {
			c.lru.MoveToFront(e)
			if leading {
				hit++
			}
			run = -1
		} else {
			leading = false
			if len(c.byHash) >= c.capacity {
				back := c.lru.Back()
				if back == nil || c.protected(back, len(tokens)/bs) {
					break // the prompt alone fills the pool
				}
				old := back.Value.(*cachedBlock)
				c.lru.Remove(back)
				delete(c.byHash, old.hash)
				removed = append(removed, old.hash)
			}
			c.byHash[h] = c.lru.PushFront(&cachedBlock{hash: h})
			if run < 0 {
				stored = append(stored, storedRun{parent: parent, adapter: adapter})
				run = len(stored) - 1
			}
			stored[run].hashes = append(stored[run].hashes, h)
			stored[run].tokens = append(stored[run].tokens, block...)
		}
		hh := h
		parent = &hh
	}
	return hit, stored, removed
}

// protected: e is among the n most recent blocks (this prompt's).
func (c *rankCache) protected(e *list.Element, n int) bool {
	i := 0
	for x := c.lru.Front(); x != nil && i < n; x = x.Next() {
		if x == e {
			return true
		}
		i++
	}
	return false
}
