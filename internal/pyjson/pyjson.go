// Package pyjson writes JSON values as Python's json.dumps writes them:
// the strings vLLM and Hugging Face chat templates render (a tool call's
// arguments, the tojson filter) are Python's, not Go's encoding/json's.
// Shared by internal/apireq (tool_use input as vLLM's json.dumps) and
// internal/chattmpl (transformers' tojson). Standard library only.
package pyjson

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
)

// WriteString quotes s as json.dumps does: the short escapes for \" \\ \n
// \r \t \b \f, \u00XX for other control characters, and with ensureASCII
// (json.dumps' default) every character outside space..tilde as \uXXXX
// (surrogate pairs above the BMP), DEL included.
func WriteString(b *strings.Builder, s string, ensureASCII bool) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r >= 0x20 && (!ensureASCII || r <= 0x7e) {
				b.WriteRune(r)
				continue
			}
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
		}
	}
	b.WriteByte('"')
}

// Float formats f as Python's float repr: the shortest digits that round
// trip, fixed notation for exponents in [-4, 16) with a ".0" on integral
// values, "d.ddde±XX" otherwise; NaN and ±Infinity as json.dumps writes
// them.
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

// Number is a JSON number as Python reads and writes it back: an integer
// as it is, a float as its repr (Float).
func Number(n string) string {
	if !strings.ContainsAny(n, ".eE") {
		return n
	}
	f, err := strconv.ParseFloat(n, 64)
	if err != nil {
		return n
	}
	return Float(f)
}
