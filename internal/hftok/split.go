package hftok

import (
	"unicode"
	"unicode/utf8"
)

// splitter cuts normalized text into pre-tokens (words), calling emit for
// each in order.
type splitter func(s string, emit func(string))

// The Split regexes of the supported families. Go's regexp has no
// look-ahead (`\s+(?!\S)`), so each is a hand-written scanner with the same
// leftmost-alternative, greedy semantics, checked token for token against
// the JavaScript reference (testdata).
const (
	qwenPattern   = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

var knownPatterns = map[string]splitter{
	qwenPattern:   scanner{maxDigits: 1}.split,
	llama3Pattern: scanner{maxDigits: 3}.split,
}

// splitGPT2 is ByteLevel's own regex:
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
var splitGPT2 = scanner{gpt2: true}.split

type scanner struct {
	gpt2      bool // the GPT-2 pattern; else the Qwen/Llama 3 one
	maxDigits int  // \p{N}{1,maxDigits} (Qwen 1, Llama 3 3)
}

// isSpace is \s: Unicode White_Space.
func isSpace(r rune) bool { return unicode.IsSpace(r) }

func isLetter(r rune) bool { return unicode.IsLetter(r) }
func isNumber(r rune) bool { return unicode.IsNumber(r) }

// other is [^\s\p{L}\p{N}].
func other(r rune) bool { return !isSpace(r) && !isLetter(r) && !isNumber(r) }

func at(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// run is the end of the longest run from i of runes satisfying f, and
// how many runes it holds (stopping at max runes when max > 0).
func run(s string, i int, f func(rune) bool, max int) (int, int) {
	n := 0
	for i < len(s) && (max <= 0 || n < max) {
		r, sz := at(s, i)
		if !f(r) {
			break
		}
		i += sz
		n++
	}
	return i, n
}

func (sc scanner) split(s string, emit func(string)) {
	for i := 0; i < len(s); {
		n := sc.match(s, i)
		if n <= 0 { // cannot happen: every rune is in some class
			_, n = at(s, i)
		}
		emit(s[i : i+n])
		i += n
	}
}

// match returns the length of the pre-token starting at i.
func (sc scanner) match(s string, i int) int {
	if n := contraction(s, i, !sc.gpt2); n > 0 {
		return n
	}
	r0, sz0 := at(s, i)
	// Letters, with an optional leading rune.
	if sc.gpt2 {
		j := i
		if r0 == ' ' {
			j += 1
		}
		if e, k := run(s, j, isLetter, 0); k > 0 {
			return e - i
		}
	} else {
		if r0 != '\r' && r0 != '\n' && !isLetter(r0) && !isNumber(r0) {
			if e, k := run(s, i+sz0, isLetter, 0); k > 0 {
				return e - i
			}
		}
		if e, k := run(s, i, isLetter, 0); k > 0 {
			return e - i
		}
	}
	// Numbers.
	if sc.gpt2 {
		j := i
		if r0 == ' ' {
			j += 1
		}
		if e, k := run(s, j, isNumber, 0); k > 0 {
			return e - i
		}
	} else if e, k := run(s, i, isNumber, sc.maxDigits); k > 0 {
		return e - i
	}
	// Other runes, with an optional leading space (and, Qwen/Llama 3,
	// trailing line breaks).
	j := i
	if r0 == ' ' {
		if r1, _ := at(s, i+1); r1 >= 0 && other(r1) {
			j = i + 1
		}
	}
	if e, k := run(s, j, other, 0); k > 0 {
		if !sc.gpt2 {
			e, _ = run(s, e, func(r rune) bool { return r == '\r' || r == '\n' }, 0)
		}
		return e - i
	}
	// White space.
	end, k := run(s, i, isSpace, 0)
	if k == 0 {
		return 0
	}
	if !sc.gpt2 {
		// \s*[\r\n]+: through the last line break of the run.
		last := -1
		for p := i; p < end; {
			r, sz := at(s, p)
			if r == '\r' || r == '\n' {
				last = p + sz
			}
			p += sz
		}
		if last > 0 {
			return last - i
		}
	}
	// \s+(?!\S): the run, less its last rune when a non-space follows.
	if end == len(s) {
		return end - i
	}
	if k >= 2 {
		_, szLast := lastRune(s[i:end])
		return end - szLast - i
	}
	return end - i // \s+
}

func lastRune(s string) (rune, int) { return utf8.DecodeLastRuneInString(s) }

// contraction matches 's 't 're 've 'm 'll 'd (case-insensitively when ci).
func contraction(s string, i int, ci bool) int {
	if s[i] != '\'' {
		return 0
	}
	for _, c := range []string{"s", "t", "re", "ve", "m", "ll", "d"} {
		if i+1+len(c) > len(s) {
			continue
		}
		got := s[i+1 : i+1+len(c)]
		if got == c || (ci && equalFoldASCII(got, c)) {
			return 1 + len(c)
		}
	}
	return 0
}

func equalFoldASCII(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
