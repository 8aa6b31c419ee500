// Package pyjson writes JSON as Python's json.dumps writes it: its quoting
// of strings (ensure_ascii on or off) and its repr of floats. The engines'
// servers are Python: what they write, the edge and the workers must write
// byte for byte (vLLM's tool call arguments, a chat template's tojson).
package pyjson

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
)

// Dumps writes a JSON value as Python's json.dumps writes it with its
// defaults: ", " and ": " separators, every character beyond ASCII
// escaped (\uXXXX, surrogate pairs beyond the BMP), floats as Python's
// repr. vLLM's Anthropic endpoint writes a tool_use block's input so as
// the arguments of the chat form's tool call
// (vllm/entrypoints/anthropic/serving.py _convert_tool_use_block:
// json.dumps(block.input)), and a chat template renders that string, so
// the chat form carries the same bytes. raw must be valid JSON.
func Dumps(raw json.RawMessage) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var b strings.Builder
	// Per open array or object: whether a value was written in it, and
	// for an object whether the next string is a key.
	type level struct {
		object, any, key bool
	}
	var stack []level
	for {
		t, err := dec.Token()
		if err != nil {
			if b.Len() == 0 {
				return string(raw)
			}
			return b.String()
		}
		if d, ok := t.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			b.WriteRune(rune(d))
			continue
		}
		if n := len(stack); n > 0 {
			top := &stack[n-1]
			switch {
			case top.object && top.key:
				if top.any {
					b.WriteString(", ")
				}
				top.any, top.key = true, false
				Quote(&b, t.(string), true)
				b.WriteString(": ")
				continue
			case top.object:
				top.key = true
			default:
				if top.any {
					b.WriteString(", ")
				}
				top.any = true
			}
		}
		switch x := t.(type) {
		case json.Delim:
			b.WriteRune(rune(x))
			stack = append(stack, level{object: x == '{', key: x == '{'})
		case nil:
			b.WriteString("null")
		case bool:
			b.WriteString(strconv.FormatBool(x))
		case json.Number:
			b.WriteString(Number(string(x)))
		case string:
			Quote(&b, x, true)
		}
	}
}

// Quote quotes s as json.dumps does: the short escapes for \" \\ \n \r
// \t \b \f, \u00XX for other control characters, and with ensureASCII
// every character outside printable ASCII (DEL and beyond) as \uXXXX, a
// surrogate pair above the BMP.
func Quote(b *strings.Builder, s string, ensureASCII bool) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20 || (ensureASCII && r > 0x7e):
			units := []uint16{uint16(r)}
			if r > 0xffff {
				r1, r2 := utf16.EncodeRune(r)
				units = []uint16{uint16(r1), uint16(r2)}
			}
			for _, u := range units {
				b.WriteString(`\u`)
				b.WriteByte(hex[u>>12&0xf])
				b.WriteByte(hex[u>>8&0xf])
				b.WriteByte(hex[u>>4&0xf])
				b.WriteByte(hex[u&0xf])
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

// Number is a JSON number as Python writes it back: an integer as it is, a
// float as its repr (Float).
func Number(n string) string {
	if !strings.ContainsAny(n, ".eE") {
		return n
	}
	f, err := strconv.ParseFloat(n, 64)
	if err != nil && !math.IsInf(f, 0) {
		return n
	}
	return Float(f)
}

// Float is Python's repr of f: the shortest digits that round trip, fixed
// notation with a ".0" on integral values when the exponent is in [-4, 16),
// else d.ddde±XX; NaN, Infinity and -Infinity as json.dumps writes them.
func Float(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	if exp >= -4 && exp < 16 {
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.Contains(s, ".") {
			s += ".0"
		}
		return s
	}
	sign := "+"
	if exp < 0 {
		sign, exp = "-", -exp
	}
	es := strconv.Itoa(exp)
	if len(es) < 2 {
		es = "0" + es
	}
	return mant + "e" + sign + es
}
