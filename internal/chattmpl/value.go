package chattmpl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/tether-project/tether/internal/pyjson"
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
//
// A hand-written scanner: encoding/json's token API took a third of a
// 32k-token render.
func decodeOrdered(data []byte) (any, error) {
	d := &decoder{data: data}
	d.space()
	v, err := d.value(0)
	if err != nil {
		return nil, err
	}
	if d.space(); d.pos != len(d.data) {
		return nil, fmt.Errorf("trailing data after JSON value at offset %d", d.pos)
	}
	return v, nil
}

type decoder struct {
	data []byte
	pos  int
}

func (d *decoder) space() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *decoder) errorf(format string, args ...any) error {
	return fmt.Errorf("invalid JSON at offset %d: %s", d.pos, fmt.Sprintf(format, args...))
}

func (d *decoder) value(depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("JSON nested deeper than %d", maxDepth)
	}
	if d.pos >= len(d.data) {
		return nil, d.errorf("unexpected end")
	}
	switch c := d.data[d.pos]; {
	case c == '{':
		return d.object(depth)
	case c == '[':
		return d.array(depth)
	case c == '"':
		return d.str()
	case c == 't':
		return true, d.literal("true")
	case c == 'f':
		return false, d.literal("false")
	case c == 'n':
		return nil, d.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		start := d.pos
		for d.pos < len(d.data) && strings.IndexByte("+-0123456789.eE", d.data[d.pos]) >= 0 {
			d.pos++
		}
		if !json.Valid(d.data[start:d.pos]) {
			return nil, d.errorf("bad number %q", d.data[start:d.pos])
		}
		return number(json.Number(d.data[start:d.pos]))
	default:
		return nil, d.errorf("unexpected %q", c)
	}
}

func (d *decoder) literal(lit string) error {
	if !bytes.HasPrefix(d.data[d.pos:], []byte(lit)) {
		return d.errorf("want %s", lit)
	}
	d.pos += len(lit)
	return nil
}

func (d *decoder) object(depth int) (any, error) {
	obj := exec.Dict{Pairs: []*exec.Pair{}}
	d.pos++ // {
	d.space()
	if d.pos < len(d.data) && d.data[d.pos] == '}' {
		d.pos++
		return obj, nil
	}
	for {
		d.space()
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return nil, d.errorf("want an object key")
		}
		k, err := d.str()
		if err != nil {
			return nil, err
		}
		d.space()
		if d.pos >= len(d.data) || d.data[d.pos] != ':' {
			return nil, d.errorf("want ':'")
		}
		d.pos++
		d.space()
		v, err := d.value(depth + 1)
		if err != nil {
			return nil, err
		}
		setPair(&obj, k, v)
		d.space()
		if d.pos >= len(d.data) {
			return nil, d.errorf("unexpected end in object")
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case '}':
			d.pos++
			return obj, nil
		default:
			return nil, d.errorf("want ',' or '}'")
		}
	}
}

func (d *decoder) array(depth int) (any, error) {
	list := []any{}
	d.pos++ // [
	d.space()
	if d.pos < len(d.data) && d.data[d.pos] == ']' {
		d.pos++
		return list, nil
	}
	for {
		d.space()
		v, err := d.value(depth + 1)
		if err != nil {
			return nil, err
		}
		list = append(list, v)
		d.space()
		if d.pos >= len(d.data) {
			return nil, d.errorf("unexpected end in array")
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case ']':
			d.pos++
			return list, nil
		default:
			return nil, d.errorf("want ',' or ']'")
		}
	}
}

// str reads a string; one without escapes is its bytes, else
// encoding/json unquotes it.
func (d *decoder) str() (string, error) {
	// (a hand-written unescape for the common case: tool outputs and code
	// are full of \n and \t, and encoding/json re-scans each string)
	start := d.pos
	d.pos++ // "
	escaped := false
	for d.pos < len(d.data) {
		switch c := d.data[d.pos]; {
		case c == '"':
			d.pos++
			raw := d.data[start:d.pos]
			if utf8.Valid(raw) {
				if !escaped {
					return string(raw[1 : len(raw)-1]), nil
				}
				if s, ok := unescape(raw[1 : len(raw)-1]); ok {
					return s, nil
				}
			}
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return "", d.errorf("bad string: %v", err)
			}
			return s, nil
		case c == '\\':
			escaped = true
			d.pos += 2
		case c < 0x20:
			return "", d.errorf("control character in string")
		default:
			d.pos++
		}
	}
	return "", d.errorf("unterminated string")
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
		pyjson.Quote(b, x, o.ensureASCII)
	case int:
		b.WriteString(strconv.Itoa(x))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		b.WriteString(pyjson.Float(x))
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
		b.WriteString(pyjson.Float(rv.Float()))
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
		pyjson.Quote(b, p.Key.String(), o.ensureASCII)
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

// unescape decodes the escapes of a valid UTF-8 JSON string body; ok false
// (a lone surrogate, a bad escape) leaves it to encoding/json.
func unescape(b []byte) (string, bool) {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		if i+1 >= len(b) {
			return "", false
		}
		i++
		switch b[i] {
		case '"', '\\', '/':
			out = append(out, b[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(b, i+1)
			if !ok {
				return "", false
			}
			i += 4
			if utf16.IsSurrogate(r) {
				if i+2 >= len(b) || b[i+1] != '\\' || b[i+2] != 'u' {
					return "", false
				}
				r2, ok := hex4(b, i+3)
				if !ok {
					return "", false
				}
				if r = utf16.DecodeRune(r, r2); r == utf8.RuneError {
					return "", false
				}
				i += 6
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", false
		}
	}
	return string(out), true
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[i:i+4]), 16, 32)
	return rune(v), err == nil
}
