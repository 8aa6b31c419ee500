// Package hftok tokenizes text with a Hugging Face tokenizer.json of the
// byte-level BPE family (Qwen2/Qwen3, Llama 3, GPT-2 style): added tokens,
// NFC normalization, the Split pre-tokenizer's regular expression, byte-level
// mapping, then BPE merges by rank; and of the SentencePiece-style family
// (byte-fallback BPE: Mistral, Llama 2, Gemma; sentencepiece.go). It is what
// an edge needs to compute the token ids (and so the block keys) an engine
// computes for the same prompt.
//
// Pure: it parses bytes the caller read; no I/O, no clock, no randomness.
// Chat templates are not rendered here (see DESIGN.md).
package hftok

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Tokenizer is a loaded tokenizer. Safe for concurrent use.
type Tokenizer struct {
	vocab   map[string]uint32
	ranks   map[pair]int
	added   []addedToken // longest first
	addedBy [256][]int   // added tokens by first byte
	// maxAdded is the longest added token's length in bytes.
	maxAdded int
	nfc      bool
	// ignoreMerges: a word found whole in the vocabulary is one token,
	// without running the merges (Llama 3); otherwise merges always run.
	ignoreMerges bool
	split        splitter
	byteMap      [256]string // byte → its byte-level symbol
	// sp is the SentencePiece-style pipeline of a byte_fallback file
	// (sentencepiece.go); nil for byte-level BPE.
	sp *spPipeline

	cacheMu sync.RWMutex
	cache   map[string][]uint32
}

type pair struct{ a, b string }

type addedToken struct {
	content string
	id      uint32
}

// maxCache bounds the word cache (entries).
const maxCache = 1 << 16

type fileJSON struct {
	AddedTokens []struct {
		ID      uint32 `json:"id"`
		Content string `json:"content"`
	} `json:"added_tokens"`
	Normalizer   *struct{ Type string } `json:"normalizer"`
	PreTokenizer *preTokJSON            `json:"pre_tokenizer"`
	Model        struct {
		Type         string            `json:"type"`
		Vocab        map[string]uint32 `json:"vocab"`
		Merges       json.RawMessage   `json:"merges"`
		ByteFallback bool              `json:"byte_fallback"`
		IgnoreMerges bool              `json:"ignore_merges"`
	} `json:"model"`
}

type preTokJSON struct {
	Type          string        `json:"type"`
	Pretokenizers []*preTokJSON `json:"pretokenizers"`
	Pattern       *struct {
		Regex  string `json:"Regex"`
		String string `json:"String"`
	} `json:"pattern"`
	Behavior       string `json:"behavior"`
	Invert         bool   `json:"invert"`
	AddPrefixSpace bool   `json:"add_prefix_space"`
	UseRegex       *bool  `json:"use_regex"`
}

// Load parses a tokenizer.json. It rejects what it does not implement
// rather than tokenizing differently from the engine.
func Load(data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("hftok: tokenizer.json: %w", err)
	}
	if f.Model.Type != "BPE" {
		return nil, fmt.Errorf("hftok: model type %q: only BPE is supported", f.Model.Type)
	}
	t := &Tokenizer{vocab: f.Model.Vocab, cache: map[string][]uint32{}}
	merges, err := parseMerges(f.Model.Merges)
	if err != nil {
		return nil, err
	}
	t.ranks = make(map[pair]int, len(merges))
	for i, p := range merges {
		if _, dup := t.ranks[p]; !dup {
			t.ranks[p] = i
		}
	}
	t.ignoreMerges = f.Model.IgnoreMerges
	if f.Model.ByteFallback {
		// SentencePiece-style (sentencepiece.go).
		if t.ignoreMerges {
			return nil, errors.New("hftok: byte_fallback BPE with ignore_merges is not supported")
		}
		if err := t.loadSentencePiece(data); err != nil {
			return nil, err
		}
		t.loadAdded(f)
		return t, nil
	}
	if f.Normalizer != nil {
		switch f.Normalizer.Type {
		case "NFC":
			t.nfc = true
		default:
			return nil, fmt.Errorf("hftok: normalizer %q is not supported", f.Normalizer.Type)
		}
	}
	if t.split, err = pretokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	t.loadAdded(f)
	t.byteMap = byteLevelMap()
	return t, nil
}

// loadAdded indexes the added tokens, longest first.
func (t *Tokenizer) loadAdded(f fileJSON) {
	for _, a := range f.AddedTokens {
		if a.Content != "" {
			t.added = append(t.added, addedToken{a.Content, a.ID})
		}
	}
	slices.SortStableFunc(t.added, func(x, y addedToken) int { return len(y.content) - len(x.content) })
	for i, a := range t.added {
		t.addedBy[a.content[0]] = append(t.addedBy[a.content[0]], i)
		t.maxAdded = max(t.maxAdded, len(a.content))
	}
}

// parseMerges reads merges as ["a b", …] (older files) or [["a","b"], …].
func parseMerges(raw json.RawMessage) ([]pair, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil {
		out := make([]pair, len(strs))
		for i, s := range strs {
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return nil, fmt.Errorf("hftok: merges[%d]: %q is not two symbols", i, s)
			}
			out[i] = pair{a, b}
		}
		return out, nil
	}
	var lists [][]string
	if err := json.Unmarshal(raw, &lists); err != nil {
		return nil, fmt.Errorf("hftok: merges: want strings or pairs: %w", err)
	}
	out := make([]pair, len(lists))
	for i, l := range lists {
		if len(l) != 2 {
			return nil, fmt.Errorf("hftok: merges[%d]: %d symbols, want 2", i, len(l))
		}
		out[i] = pair{l[0], l[1]}
	}
	return out, nil
}

// pretokenizer accepts Sequence[Split(regex, Isolated), ByteLevel(no
// regex)] and a bare ByteLevel with its GPT-2 regex.
func pretokenizer(p *preTokJSON) (splitter, error) {
	if p == nil {
		return nil, errors.New("hftok: no pre_tokenizer")
	}
	switch p.Type {
	case "ByteLevel":
		if p.AddPrefixSpace {
			return nil, errors.New("hftok: ByteLevel add_prefix_space is not supported")
		}
		if p.UseRegex != nil && !*p.UseRegex {
			return nil, errors.New("hftok: ByteLevel without a regex and without a Split is not supported")
		}
		return splitGPT2, nil
	case "Sequence":
		if len(p.Pretokenizers) != 2 || p.Pretokenizers[0].Type != "Split" || p.Pretokenizers[1].Type != "ByteLevel" {
			return nil, errors.New("hftok: pre_tokenizer Sequence: only [Split, ByteLevel] is supported")
		}
		s, bl := p.Pretokenizers[0], p.Pretokenizers[1]
		if bl.AddPrefixSpace || (bl.UseRegex != nil && *bl.UseRegex) {
			return nil, errors.New("hftok: ByteLevel after Split must have add_prefix_space and use_regex off")
		}
		if s.Pattern == nil || s.Behavior != "Isolated" || s.Invert {
			return nil, errors.New("hftok: Split must be an isolated regex split")
		}
		sp, ok := knownPatterns[s.Pattern.Regex]
		if !ok {
			return nil, fmt.Errorf("hftok: Split regex %q is not one of the supported patterns (Qwen2/3, Llama 3)", s.Pattern.Regex)
		}
		return sp, nil
	}
	return nil, fmt.Errorf("hftok: pre_tokenizer %q is not supported", p.Type)
}

// Encode returns the token ids of text (no special tokens added).
func (t *Tokenizer) Encode(text string) []uint32 {
	return t.Append(nil, text)
}

// Append is Encode appending to dst.
func (t *Tokenizer) Append(dst []uint32, text string) []uint32 {
	return t.appendCuts(dst, text, 0, nil)
}

// appendCuts encodes text[from:] (from is 0 or just after an added token)
// and calls cut, when not nil, after each added token with the byte offset
// where it ends and len(dst).
func (t *Tokenizer) appendCuts(dst []uint32, text string, from int, cut func(off, n int)) []uint32 {
	start := from
	for i := from; i < len(text); {
		if cands := t.addedBy[text[i]]; len(cands) > 0 {
			if a, ok := t.matchAdded(text[i:], cands); ok {
				dst = t.appendSegment(dst, text[start:i], start == 0)
				dst = append(dst, a.id)
				i += len(a.content)
				start = i
				if cut != nil {
					cut(i, len(dst))
				}
				continue
			}
		}
		i++
	}
	return t.appendSegment(dst, text[start:], start == 0)
}

func (t *Tokenizer) matchAdded(s string, cands []int) (addedToken, bool) {
	for _, c := range cands {
		if a := t.added[c]; strings.HasPrefix(s, a.content) {
			return a, true
		}
	}
	return addedToken{}, false
}

// appendSegment encodes text between added tokens (atStart: it begins the
// text).
func (t *Tokenizer) appendSegment(dst []uint32, s string, atStart bool) []uint32 {
	if s == "" {
		return dst
	}
	if t.sp != nil {
		return t.spEncode(dst, s, atStart)
	}
	if t.nfc && !norm.NFC.IsNormalString(s) {
		s = norm.NFC.String(s)
	}
	var b strings.Builder
	encode := func(word string) []uint32 {
		b.Reset()
		for i := 0; i < len(word); i++ {
			b.WriteString(t.byteMap[word[i]])
		}
		return t.bpe(b.String())
	}
	t.split(s, func(word string) {
		// The cache is keyed by the raw word: a hit (the common case in
		// chat prompts) skips the byte-level mapping and BPE.
		dst = append(dst, t.cachedWord(word, encode)...)
	})
	return dst
}

// cachedWord is the ids of word from the word cache, else encode's (then
// cached; the cache is cleared when full).
func (t *Tokenizer) cachedWord(word string, encode func(string) []uint32) []uint32 {
	t.cacheMu.RLock()
	ids, ok := t.cache[word]
	t.cacheMu.RUnlock()
	if ok {
		return ids
	}
	ids = encode(word)
	t.cacheMu.Lock()
	if len(t.cache) >= maxCache {
		clear(t.cache)
	}
	t.cache[strings.Clone(word)] = ids
	t.cacheMu.Unlock()
	return ids
}

// bpe runs BPE on one byte-level word.
func (t *Tokenizer) bpe(w string) []uint32 {
	if id, ok := t.vocab[w]; ok && t.ignoreMerges {
		return []uint32{id}
	}
	syms := make([]string, 0, utf8.RuneCountInString(w))
	for _, r := range w {
		syms = append(syms, string(r))
	}
	for len(syms) > 1 {
		best, at := -1, -1
		for i := 0; i+1 < len(syms); i++ {
			if r, ok := t.ranks[pair{syms[i], syms[i+1]}]; ok && (best < 0 || r < best) {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		// Merge every occurrence of the best pair, left to right.
		p := pair{syms[at], syms[at+1]}
		out := syms[:0]
		for i := 0; i < len(syms); {
			if i+1 < len(syms) && syms[i] == p.a && syms[i+1] == p.b {
				out = append(out, p.a+p.b)
				i += 2
			} else {
				out = append(out, syms[i])
				i++
			}
		}
		syms = out
	}
	ids := make([]uint32, 0, len(syms))
	for _, s := range syms {
		if id, ok := t.vocab[s]; ok {
			ids = append(ids, id)
		}
		// A symbol outside the vocabulary cannot happen with a complete
		// byte-level vocabulary (every byte symbol is in it).
	}
	return ids
}

// byteLevelMap is GPT-2's bytes_to_unicode: printable bytes map to
// themselves, the others to code points from U+0100 on.
func byteLevelMap() [256]string {
	var m [256]string
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			m[b] = string(rune(b))
		} else {
			m[b] = string(rune(256 + n))
			n++
		}
	}
	return m
}
