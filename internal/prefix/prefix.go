// Package prefix turns prompts into the token blocks that KV caches hold and
// names each block by a chained hash. Edges and workers must agree on these
// bytes exactly: an edge looks a request's block hashes up in its index of
// what each worker holds, and a worker's paged cache stores blocks under the
// same hashes. It is pure: no I/O, no clock, no randomness.
//
// Tokenization is deliberately simple (whitespace-separated words, each word
// one token id) because tether schedules, it does not run models: what matters
// is that equal prompt prefixes give equal token prefixes, cheaply.
package prefix

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/tether-project/tether/internal/hash64"
)

// DefaultBlockSize is the number of tokens per KV block.
const DefaultBlockSize = 64

// Message is one chat message, already flattened to text.
type Message struct {
	Role    string
	Content string
}

// RenderChat renders chat messages to the prompt text both sides tokenize.
// Each message becomes a role marker token followed by its content, so two
// conversations share a token prefix exactly as long as they share messages.
func RenderChat(msgs []Message) string {
	var b strings.Builder
	n := 0
	for _, m := range msgs {
		n += len(m.Role) + len(m.Content) + 8
	}
	b.Grow(n)
	for _, m := range msgs {
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|> ")
		b.WriteString(m.Content)
		b.WriteString("\n")
	}
	return b.String()
}

// Tokenize splits text on Unicode white space; each word is one token whose
// id is a 31-bit FNV-1a hash of its bytes. Invalid UTF-8 is tokenized byte for
// byte like valid text (it never fails).
func Tokenize(text string) []uint32 {
	toks := make([]uint32, 0, len(text)/5+1)
	return AppendTokens(toks, text)
}

// AppendTokens is Tokenize appending to dst.
func AppendTokens(dst []uint32, text string) []uint32 {
	const offset32, prime32 = 2166136261, 16777619
	h := uint32(offset32)
	in := false
	for i := 0; i < len(text); {
		c := text[i]
		var space bool
		size := 1
		if c < utf8.RuneSelf {
			space = c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f'
		} else {
			r, sz := utf8.DecodeRuneInString(text[i:])
			size = sz
			space = r != utf8.RuneError && unicode.IsSpace(r)
		}
		if space {
			if in {
				dst = append(dst, h&0x7fffffff)
				h, in = offset32, false
			}
		} else {
			for j := 0; j < size; j++ {
				h ^= uint32(text[i+j])
				h *= prime32
			}
			in = true
		}
		i += size
	}
	if in {
		dst = append(dst, h&0x7fffffff)
	}
	return dst
}

// CountTokens returns len(Tokenize(text)) without allocating.
func CountTokens(text string) int {
	n := 0
	in := false
	for _, r := range text {
		if unicode.IsSpace(r) {
			in = false
		} else if !in {
			in = true
			n++
		}
	}
	return n
}

// BlockHashes returns the chained hash of every full block of tokens: block
// i's hash depends on all tokens of blocks 0..i. A trailing partial block is
// not hashed (caches hold whole blocks only).
func BlockHashes(tokens []uint32, blockSize int) []uint64 {
	return AdapterBlockHashes("", tokens, blockSize)
}

// ChainHash hashes one block of tokens chained to its predecessor's hash
// (0 for the first block). It is a 64-bit multiply-xorshift mix, fast and
// stable across platforms and versions: changing it invalidates every index.
func ChainHash(prev uint64, block []uint32) uint64 {
	h := prev ^ 0x9e3779b97f4a7c15
	for _, t := range block {
		h ^= uint64(t)
		h *= 0xbf58476d1ce4e5b9
		h ^= h >> 31
	}
	h ^= uint64(len(block))
	h *= 0x94d049bb133111eb
	h ^= h >> 29
	if h == 0 { // 0 means "no predecessor"; keep it out of the hash space
		h = 1
	}
	return h
}

// AdapterSeed is the chain's starting value for prompts run under LoRA
// adapter name ("" the base model: 0, no seed). An engine's KV of a prompt
// under an adapter is not the base model's nor another adapter's: vLLM puts
// the adapter's name in every block hash (kv_cache_utils.py,
// _gen_lora_extra_hash_keys, part of each block's extra keys). Seeding the
// chain does the same for tether's keys: every block of the chain depends
// on the name, so a base-model prefix is credited only to base requests.
func AdapterSeed(name string) uint64 {
	if name == "" {
		return 0
	}
	h := hash64.FNV1a("lora\x00" + name) // then murmur3's 64-bit finalizer
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	if h == 0 {
		h = 1
	}
	return h
}

// AdapterBlockHashes is BlockHashes for a prompt run under LoRA adapter
// name (the base model's keys when name is "").
func AdapterBlockHashes(name string, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		blockSize = DefaultBlockSize
	}
	n := len(tokens) / blockSize
	out := make([]uint64, n)
	prev := AdapterSeed(name)
	for i := 0; i < n; i++ {
		prev = ChainHash(prev, tokens[i*blockSize:(i+1)*blockSize])
		out[i] = prev
	}
	return out
}
