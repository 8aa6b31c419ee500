package sim

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"

	"github.com/tether-project/tether/internal/hash64"
)

// What the simulated model reads of the last user turn (DESIGN.md, "What
// the model answers"): the tools it names, the length it asks for, and
// its backquoted spans, which fill tool arguments.

// answerLength is the number of words after which free text ends on its
// own (the model's stop token): the length the user asked for ("2000
// words", "a 300-word summary", "50 tokens"), else a length drawn from the
// output seed, first an octave (16, 32, 64 or 128 words) then a length
// within it: 16 to 255 words, short answers as likely as long ones.
func answerLength(seed uint64, userText string) int {
	if n := askedLength(userText); n > 0 {
		return n
	}
	x := hash64.Mix64(seed ^ 0x5eed1e6a7f0c3b29)
	octave := 16 << (x % 4)
	return octave + int((x>>2)%uint64(octave))
}

// askedLengthRE finds "<N> words" or "<N> tokens" (also "N-word").
var askedLengthRE = regexp.MustCompile(`(?i)\b(\d{1,7})(?:\s+|-)(?:words?|tokens?)\b`)

// askedLength is the answer length the user asks for (0: none).
func askedLength(userText string) int {
	m := askedLengthRE.FindStringSubmatch(userText)
	if m == nil {
		return 0
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		return 0
	}
	return n
}

// mentions reports whether text names a tool: name as a whole word
// (not inside a longer name such as ListAgents for Agent), in any case,
// or exactly as written when exact.
func mentions(text, name string, exact bool) bool {
	if !exact {
		text, name = strings.ToLower(text), strings.ToLower(name)
	}
	for from := 0; from < len(text); {
		i := strings.Index(text[from:], name)
		if i < 0 {
			return false
		}
		i += from
		end := i + len(name)
		if (i == 0 || !nameByte(text[i-1])) && (end == len(text) || !nameByte(text[end])) {
			return true
		}
		from = i + 1
	}
	return false
}

// nameByte is a byte a function name may hold ([A-Za-z0-9_-]).
func nameByte(c byte) bool {
	return c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// codeSpans are the backquoted spans of text, as Markdown (CommonMark)
// reads code spans: a run of n backquotes opens one and the next run of
// exactly n closes it (a span opened by two backquotes may hold single
// ones); line breaks become spaces, and each span is trimmed of
// surrounding spaces. An unclosed run is literal text. outside is text with every span replaced by a space.
func codeSpans(text string) (spans []string, outside string) {
	run := func(i int) int {
		n := 0
		for i+n < len(text) && text[i+n] == '`' {
			n++
		}
		return n
	}
	var rest strings.Builder
	last := 0
	for i := 0; i < len(text); {
		if text[i] != '`' {
			i++
			continue
		}
		n := run(i)
		closeAt := -1
		for j := i + n; j < len(text); {
			if text[j] != '`' {
				j++
				continue
			}
			m := run(j)
			if m == n {
				closeAt = j
				break
			}
			j += m
		}
		if closeAt < 0 {
			i += n
			continue
		}
		spans = append(spans, strings.TrimSpace(strings.ReplaceAll(text[i+n:closeAt], "\n", " ")))
		rest.WriteString(text[last:i])
		rest.WriteByte(' ')
		i = closeAt + n
		last = i
	}
	rest.WriteString(text[last:])
	return spans, rest.String()
}

// jsonString is s as a JSON string, without HTML escapes (a command's
// ">" stays ">", as a model writes it).
func jsonString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(b.String(), "\n")
}
