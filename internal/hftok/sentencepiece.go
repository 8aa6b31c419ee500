package hftok

import (
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// SentencePiece-style tokenizer.json files (Llama 2, Mistral, Gemma: BPE
// with byte_fallback) run another pipeline than the byte-level one: the
// text between added tokens is normalized (Prepend "▁", Replace " " by
// "▁", NFC), pre-tokenized (none; Metaspace, which replaces spaces by "▁"
// and prepends one per its prepend_scheme; or a Split on a literal string),
// and each word is merged character by character, lowest rank first and
// leftmost among equals, as Hugging Face tokenizers' BPE does; a final
// symbol outside the vocabulary becomes its UTF-8 bytes' "<0xXX>" tokens
// (byte fallback), or the unknown token when one of those is missing.

// spPipeline is the SentencePiece-style normalization and pre-tokenization.
type spPipeline struct {
	norms []spNorm
	// pre: "" none, "metaspace", "split".
	pre string
	// Metaspace.
	replacement string
	prepend     string // always | first | never
	splitMeta   bool
	// Split on a literal string.
	splitOn  string
	behavior string // MergedWithPrevious | MergedWithNext | Isolated | Removed
	unk      uint32
	hasUnk   bool
	byteIDs  [256]uint32
	byteOK   [256]bool
}

type spNorm struct {
	kind          string // prepend | replace | nfc
	arg, with     string
	replaceTarget string
}

type normJSON struct {
	Type        string      `json:"type"`
	Normalizers []*normJSON `json:"normalizers"`
	Prepend     string      `json:"prepend"`
	Pattern     *struct {
		String *string `json:"String"`
		Regex  *string `json:"Regex"`
	} `json:"pattern"`
	Content string `json:"content"`
}

type spPreJSON struct {
	Type           string `json:"type"`
	Replacement    string `json:"replacement"`
	PrependScheme  string `json:"prepend_scheme"`
	AddPrefixSpace *bool  `json:"add_prefix_space"`
	Split          *bool  `json:"split"`
	Pattern        *struct {
		String *string `json:"String"`
		Regex  *string `json:"Regex"`
	} `json:"pattern"`
	Behavior string `json:"behavior"`
	Invert   bool   `json:"invert"`
}

// loadSentencePiece sets t up for a byte-fallback BPE file (raw is the
// whole file, for the fields the byte-level loader does not read).
func (t *Tokenizer) loadSentencePiece(raw []byte) error {
	var f struct {
		Normalizer   *normJSON  `json:"normalizer"`
		PreTokenizer *spPreJSON `json:"pre_tokenizer"`
		Model        struct {
			UnkToken                *string `json:"unk_token"`
			ContinuingSubwordPrefix *string `json:"continuing_subword_prefix"`
			EndOfWordSuffix         *string `json:"end_of_word_suffix"`
			Dropout                 *float64
		} `json:"model"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return fmt.Errorf("hftok: tokenizer.json: %w", err)
	}
	m := f.Model
	if (m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "") || (m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "") {
		return errors.New("hftok: byte_fallback BPE with a subword prefix or suffix is not supported")
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return errors.New("hftok: BPE dropout is not supported (tokenization would be random)")
	}
	p := &spPipeline{}
	if f.Normalizer != nil {
		if err := p.addNorm(f.Normalizer); err != nil {
			return err
		}
	}
	if pt := f.PreTokenizer; pt != nil {
		switch pt.Type {
		case "Metaspace":
			p.pre, p.replacement = "metaspace", pt.Replacement
			if p.replacement == "" {
				p.replacement = "▁"
			}
			// Older files say add_prefix_space (true: always); newer ones
			// prepend_scheme; false turns prepending off.
			p.prepend = pt.PrependScheme
			if p.prepend == "" {
				p.prepend = "always"
			}
			if pt.AddPrefixSpace != nil && !*pt.AddPrefixSpace {
				p.prepend = "never"
			}
			switch p.prepend {
			case "always", "first", "never":
			default:
				return fmt.Errorf("hftok: Metaspace prepend_scheme %q is not supported", p.prepend)
			}
			p.splitMeta = pt.Split == nil || *pt.Split
		case "Split":
			if pt.Pattern == nil || pt.Pattern.String == nil || *pt.Pattern.String == "" || pt.Invert {
				return errors.New("hftok: a byte_fallback file's Split must split on a literal string")
			}
			switch pt.Behavior {
			case "MergedWithPrevious", "MergedWithNext", "Isolated", "Removed":
			default:
				return fmt.Errorf("hftok: Split behavior %q is not supported", pt.Behavior)
			}
			p.pre, p.splitOn, p.behavior = "split", *pt.Pattern.String, pt.Behavior
		default:
			return fmt.Errorf("hftok: pre_tokenizer %q is not supported with byte_fallback", pt.Type)
		}
	}
	if m.UnkToken != nil {
		p.unk, p.hasUnk = t.vocab[*m.UnkToken]
	}
	for b := 0; b < 256; b++ {
		p.byteIDs[b], p.byteOK[b] = t.vocab[fmt.Sprintf("<0x%02X>", b)]
	}
	t.sp = p
	return nil
}

func (p *spPipeline) addNorm(n *normJSON) error {
	switch n.Type {
	case "Sequence":
		for _, c := range n.Normalizers {
			if err := p.addNorm(c); err != nil {
				return err
			}
		}
	case "Prepend":
		p.norms = append(p.norms, spNorm{kind: "prepend", arg: n.Prepend})
	case "Replace":
		if n.Pattern == nil || n.Pattern.String == nil {
			return errors.New("hftok: Replace normalizer: only a literal String pattern is supported")
		}
		p.norms = append(p.norms, spNorm{kind: "replace", arg: *n.Pattern.String, with: n.Content})
	case "NFC":
		p.norms = append(p.norms, spNorm{kind: "nfc"})
	default:
		return fmt.Errorf("hftok: normalizer %q is not supported with byte_fallback", n.Type)
	}
	return nil
}

// words normalizes and pre-tokenizes one segment of text (between added
// tokens; atStart: it begins the text, for Metaspace's "first").
func (p *spPipeline) words(s string, atStart bool, emit func(string)) {
	if s == "" {
		return
	}
	for _, n := range p.norms {
		switch n.kind {
		case "prepend":
			if s != "" {
				s = n.arg + s
			}
		case "replace":
			if n.arg != "" {
				s = strings.ReplaceAll(s, n.arg, n.with)
			}
		case "nfc":
			if !norm.NFC.IsNormalString(s) {
				s = norm.NFC.String(s)
			}
		}
	}
	switch p.pre {
	case "metaspace":
		s = strings.ReplaceAll(s, " ", p.replacement)
		if (p.prepend == "always" || (p.prepend == "first" && atStart)) && !strings.HasPrefix(s, p.replacement) {
			s = p.replacement + s
		}
		if !p.splitMeta {
			emit(s)
			return
		}
		splitLiteral(s, p.replacement, "MergedWithNext", emit)
	case "split":
		splitLiteral(s, p.splitOn, p.behavior, emit)
	default:
		emit(s)
	}
}

// splitLiteral splits s on sep as Hugging Face's Split pre-tokenizer does
// with a string pattern and the given behavior.
func splitLiteral(s, sep, behavior string, emit func(string)) {
	var pieces []string
	last := 0
	for i := 0; i < len(s); {
		j := strings.Index(s[i:], sep)
		if j < 0 {
			break
		}
		j += i
		switch behavior {
		case "MergedWithPrevious":
			pieces = append(pieces, s[last:j+len(sep)])
			last = j + len(sep)
		case "MergedWithNext":
			if j > last {
				pieces = append(pieces, s[last:j])
			}
			last = j
		case "Isolated":
			if j > last {
				pieces = append(pieces, s[last:j])
			}
			pieces = append(pieces, sep)
			last = j + len(sep)
		case "Removed":
			if j > last {
				pieces = append(pieces, s[last:j])
			}
			last = j + len(sep)
		}
		i = j + len(sep)
	}
	if last < len(s) {
		pieces = append(pieces, s[last:])
	}
	for _, p := range pieces {
		if p != "" {
			emit(p)
		}
	}
}

// spEncode encodes one segment of text with the SentencePiece pipeline.
func (t *Tokenizer) spEncode(dst []uint32, s string, atStart bool) []uint32 {
	t.sp.words(s, atStart, func(word string) {
		dst = append(dst, t.cachedWord(word, t.spBPE)...)
	})
	return dst
}

// spBPE merges a word's characters by rank (ties: the leftmost pair), then
// maps each symbol to its id, with byte fallback for symbols outside the
// vocabulary.
func (t *Tokenizer) spBPE(word string) []uint32 {
	syms := make([]spSym, 0, utf8.RuneCountInString(word))
	for i, r := range []rune(word) {
		syms = append(syms, spSym{s: string(r), pos: i, prev: i - 1, next: i + 1})
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	q := &spQueue{}
	push := func(l int) {
		r := syms[l].next
		if r < 0 {
			return
		}
		if rank, ok := t.ranks[pair{syms[l].s, syms[r].s}]; ok {
			heap.Push(q, spCand{rank: rank, pos: syms[l].pos, left: l, right: r})
		}
	}
	for i := range syms {
		push(i)
	}
	for q.Len() > 0 {
		c := heap.Pop(q).(spCand)
		l, r := &syms[c.left], &syms[c.right]
		if l.dead || r.dead || l.next != c.right {
			continue
		}
		// The merged symbol replaces both (a new node, so queued pairs
		// naming either are stale).
		m := spSym{s: l.s + r.s, pos: l.pos, prev: l.prev, next: r.next}
		l.dead, r.dead = true, true
		syms = append(syms, m)
		mi := len(syms) - 1
		if m.prev >= 0 {
			syms[m.prev].next = mi
			push(m.prev)
		}
		if m.next >= 0 {
			syms[m.next].prev = mi
		}
		push(mi)
	}
	var ids []uint32
	// Walk the list from its head.
	head := -1
	for i := range syms {
		if !syms[i].dead && syms[i].prev < 0 {
			head = i
			break
		}
	}
	for i := head; i >= 0; i = syms[i].next {
		s := syms[i].s
		if id, ok := t.vocab[s]; ok {
			ids = append(ids, id)
			continue
		}
		all := true
		for j := 0; j < len(s); j++ {
			all = all && t.sp.byteOK[s[j]]
		}
		switch {
		case all:
			for j := 0; j < len(s); j++ {
				ids = append(ids, t.sp.byteIDs[s[j]])
			}
		case t.sp.hasUnk:
			ids = append(ids, t.sp.unk)
		}
	}
	return ids
}

type spSym struct {
	s          string
	pos        int
	prev, next int
	dead       bool
}

type spCand struct {
	rank, pos   int
	left, right int
}

type spQueue []spCand

func (q spQueue) Len() int { return len(q) }
func (q spQueue) Less(i, j int) bool {
	if q[i].rank != q[j].rank {
		return q[i].rank < q[j].rank
	}
	return q[i].pos < q[j].pos
}
func (q spQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *spQueue) Push(x any)   { *q = append(*q, x.(spCand)) }
func (q *spQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}
