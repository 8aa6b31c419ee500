package sim

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/tether-project/tether/internal/hash64"
)

// contextState is what a context-only run hands to the generation side:
// enough to find (or receive) the prompt's KV blocks and to continue the
// same deterministic output. Block hashes (8 bytes per block) stand in for
// the prompt tokens (256 bytes per 64-token block).
type contextState struct {
	blockSize    int
	promptTokens int
	seed         uint64 // output seed: the prompt's hash
	hashes       []uint64
}

const (
	stateMagic   = "TSIM"
	stateVersion = 1
)

// encode is: "TSIM", version byte, then uvarints blockSize, promptTokens,
// 8-byte little-endian seed, uvarint block count, 8-byte hashes.
func (s contextState) encode() []byte {
	b := make([]byte, 0, len(stateMagic)+1+3*binary.MaxVarintLen64+8+8*len(s.hashes))
	b = append(b, stateMagic...)
	b = append(b, stateVersion)
	b = binary.AppendUvarint(b, uint64(s.blockSize))
	b = binary.AppendUvarint(b, uint64(s.promptTokens))
	b = binary.LittleEndian.AppendUint64(b, s.seed)
	b = binary.AppendUvarint(b, uint64(len(s.hashes)))
	for _, h := range s.hashes {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b
}

func decodeContextState(b []byte) (contextState, error) {
	var s contextState
	if len(b) < len(stateMagic)+1 || string(b[:len(stateMagic)]) != stateMagic {
		return s, fmt.Errorf("context state: not a simulated-engine state: %w", ErrInvalidRequest)
	}
	if v := b[len(stateMagic)]; v != stateVersion {
		return s, fmt.Errorf("context state: version %d, this engine reads %d: %w", v, stateVersion, ErrInvalidRequest)
	}
	b = b[len(stateMagic)+1:]
	uvarint := func(what string, limit uint64) (int, error) {
		v, n := binary.Uvarint(b)
		if n <= 0 || v > limit {
			return 0, fmt.Errorf("context state: bad %s: %w", what, ErrInvalidRequest)
		}
		b = b[n:]
		return int(v), nil
	}
	var err error
	if s.blockSize, err = uvarint("block size", 1<<20); err != nil {
		return s, err
	}
	if s.promptTokens, err = uvarint("prompt tokens", 1<<40); err != nil {
		return s, err
	}
	if len(b) < 8 {
		return s, fmt.Errorf("context state: truncated seed: %w", ErrInvalidRequest)
	}
	s.seed = binary.LittleEndian.Uint64(b)
	b = b[8:]
	n, err := uvarint("block count", uint64(len(b)/8))
	if err != nil {
		return s, err
	}
	if len(b) != 8*n {
		return s, fmt.Errorf("context state: %d bytes for %d block hashes: %w", len(b), n, ErrInvalidRequest)
	}
	if s.blockSize == 0 || n != s.promptTokens/s.blockSize {
		return s, fmt.Errorf("context state: %d blocks do not cover %d tokens at block size %d: %w",
			n, s.promptTokens, s.blockSize, ErrInvalidRequest)
	}
	s.hashes = make([]uint64, n)
	for i := range s.hashes {
		s.hashes[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return s, nil
}

// promptSeed hashes the prompt's tokens (FNV-1a over the ids): equal
// prompts give equal output.
func promptSeed(tokens []uint32) uint64 { return hash64.FNV1aWords(tokens) }

// outputWords is the simulated model's vocabulary.
var outputWords = [...]string{
	"the", "agent", "reads", "tool", "result", "and", "plans", "next", "step",
	"cache", "prefix", "block", "rank", "token", "call", "returns", "value",
	"search", "file", "edit", "test", "passes", "then", "writes", "answer",
	"with", "context", "from", "parent", "session", "done", "ok",
}

// outputWord is token i of the output seeded by seed.
func outputWord(seed uint64, i int) string {
	x := seed + uint64(i)*0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	return outputWords[x%uint64(len(outputWords))]
}

// outputChunk is token i as streamed: words after the first carry their
// separating space, so the chunks concatenate to the text.
func outputChunk(seed uint64, i int) string {
	if i == 0 {
		return outputWord(seed, 0)
	}
	return " " + outputWord(seed, i)
}

// OutputText is the whole text the engine produces for a prompt of tokens
// with n completion tokens (exported for tests and tools that check output).
func OutputText(prompt []uint32, n int) string {
	return outputText(promptSeed(prompt), n)
}

func outputText(seed uint64, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteString(outputChunk(seed, i))
	}
	return b.String()
}
