package chattmpl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// maxDepth bounds the nesting of request JSON handed to a template: the
// decoder below recurses, and a request is untrusted input.
const maxDepth = 64

// decodeOrdered decodes JSON into the values the template sees, keeping
// object key order. Python's json.loads (which the engine's server uses)
// keeps it, and tojson then writes keys in that order; a Go map would sort
// them and a tool schema or tool-call arguments would render differently.
// Objects become exec.Dict (gonja's ordered dict), arrays []any, numbers
// int64 when integral in the text (Python int) and float64 otherwise.
func decodeOrdered(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, fmt.Errorf("trailing data after JSON value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("JSON nested deeper than %d", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := exec.Dict{Pairs: []*exec.Pair{}}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				setPair(&d, k, v)
			}
			_, err := dec.Token() // '}'
			return d, err
		case '[':
			list := []any{}
			for dec.More() {
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := dec.Token() // ']'
			return list, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	case json.Number:
		return number(t)
	default: // string, bool, nil
		return t, nil
	}
}

// setPair sets key to v, replacing an earlier pair of the same key in place
// as Python's dict does with a duplicated JSON key (last value, first place).
func setPair(d *exec.Dict, k string, v any) {
	for _, p := range d.Pairs {
		if p.Key.String() == k {
			p.Value = exec.AsValue(v)
			return
		}
	}
	d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue(k), Value: exec.AsValue(v)})
}

func number(n json.Number) (any, error) {
	s := string(n)
	if !strings.ContainsAny(s, ".eE") {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return i, nil
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return nil, fmt.Errorf("number %s: %w", s, err)
	}
	return f, nil
}

// dictGet returns the value of key in d.
func dictGet(d exec.Dict, key string) (any, bool) {
	for _, p := range d.Pairs {
		if p.Key.String() == key {
			return p.Value.Interface(), true
		}
	}
	return nil, false
}

// jsonOpts are the arguments of Python's json.dumps a template may pass to
// tojson. Transformers' tojson defaults ensure_ascii to False.
type jsonOpts struct {
	indent      string
	hasIndent   bool
	itemSep     string
	keySep      string
	ensureASCII bool
	sortKeys    bool
}

// writeJSON writes v as Python's json.dumps does (the engine renders chat
// templates with transformers, whose tojson is json.dumps): ", " and ": "
// separators, keys in insertion order, non-ASCII kept, floats as Python's
// repr.
func writeJSON(b *strings.Builder, v any, o *jsonOpts, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("tojson: value nested deeper than %d", maxDepth)
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case *exec.Value:
		if x == nil || x.IsNil() {
			b.WriteString("null")
			return nil
		}
		return writeJSON(b, x.Interface(), o, depth)
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case string:
		writePyString(b, x, o.ensureASCII)
	case int:
		b.WriteString(strconv.Itoa(x))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		b.WriteString(pyFloat(x))
	case exec.Dict:
		return writeObject(b, x.Pairs, o, depth)
	case *exec.Dict:
		return writeObject(b, x.Pairs, o, depth)
	case []any:
		return writeArray(b, len(x), func(i int) any { return x[i] }, o, depth)
	default:
		return writeReflect(b, reflect.ValueOf(v), o, depth)
	}
	return nil
}

// writeReflect covers what a template builds itself (namespace maps, lists
// of values, other integer kinds).
func writeReflect(b *strings.Builder, rv reflect.Value, o *jsonOpts, depth int) error {
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			b.WriteString("null")
			return nil
		}
		return writeJSON(b, rv.Elem().Interface(), o, depth)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		b.WriteString(strconv.FormatInt(rv.Int(), 10))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		b.WriteString(strconv.FormatUint(rv.Uint(), 10))
	case reflect.Float32:
		b.WriteString(pyFloat(rv.Float()))
	case reflect.Slice, reflect.Array:
		return writeArray(b, rv.Len(), func(i int) any { return rv.Index(i).Interface() }, o, depth)
	case reflect.Map:
		keys := rv.MapKeys()
		sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
		pairs := make([]*exec.Pair, len(keys))
		for i, k := range keys {
			pairs[i] = &exec.Pair{Key: exec.AsValue(fmt.Sprint(k.Interface())), Value: exec.AsValue(rv.MapIndex(k).Interface())}
		}
		return writeObject(b, pairs, o, depth)
	default:
		return fmt.Errorf("tojson: cannot serialise %s", rv.Type())
	}
	return nil
}

func writeArray(b *strings.Builder, n int, at func(int) any, o *jsonOpts, depth int) error {
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteString(o.itemSep)
		}
		o.newline(b, depth+1)
		if err := writeJSON(b, at(i), o, depth+1); err != nil {
			return err
		}
	}
	if n > 0 {
		o.newline(b, depth)
	}
	b.WriteByte(']')
	return nil
}

func writeObject(b *strings.Builder, pairs []*exec.Pair, o *jsonOpts, depth int) error {
	if o.sortKeys {
		pairs = append([]*exec.Pair(nil), pairs...)
		sort.SliceStable(pairs, func(i, j int) bool { return pairs[i].Key.String() < pairs[j].Key.String() })
	}
	b.WriteByte('{')
	for i, p := range pairs {
		if i > 0 {
			b.WriteString(o.itemSep)
		}
		o.newline(b, depth+1)
		writePyString(b, p.Key.String(), o.ensureASCII)
		b.WriteString(o.keySep)
		if err := writeJSON(b, p.Value, o, depth+1); err != nil {
			return err
		}
	}
	if len(pairs) > 0 {
		o.newline(b, depth)
	}
	b.WriteByte('}')
	return nil
}

func (o *jsonOpts) newline(b *strings.Builder, depth int) {
	if !o.hasIndent {
		return
	}
	b.WriteByte('\n')
	for range depth {
		b.WriteString(o.indent)
	}
}

// writePyString quotes s as json.dumps does: the short escapes for \" \\
// \n \r \t \b \f, \u00XX for other control characters, and with
// ensure_ascii every non-ASCII character as \uXXXX (surrogate pairs above
// the BMP).
func writePyString(b *strings.Builder, s string, ensureASCII bool) {
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
			switch {
			case r < 0x20:
				fmt.Fprintf(b, `\u%04x`, r)
			case r < utf8.RuneSelf || !ensureASCII:
				b.WriteRune(r)
			case r > 0xFFFF:
				r -= 0x10000
				fmt.Fprintf(b, `\u%04x\u%04x`, 0xD800+(r>>10), 0xDC00+(r&0x3FF))
			default:
				fmt.Fprintf(b, `\u%04x`, r)
			}
		}
	}
	b.WriteByte('"')
}

// pyFloat formats f as Python's float repr: the shortest digits that round
// trip, fixed notation for exponents in [-4, 16), always a ".0" on integral
// values, and "e+XX"/"e-XX" otherwise.
func pyFloat(f float64) string {
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
	if exp < -4 || exp >= 16 {
		sign := "+"
		if exp < 0 {
			sign, exp = "-", -exp
		}
		return fmt.Sprintf("%se%s%02d", mant, sign, exp)
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}
