package chattmpl

import (
	"fmt"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// filterToJSON is transformers' tojson (json.dumps with ensure_ascii off,
// keys in insertion order) in place of gonja's, which marshals with Go's
// encoding/json: "," and ":" without spaces and sorted map keys.
func filterToJSON(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	o := jsonOpts{itemSep: ", ", keySep: ": "}
	if len(params.Args) > 0 {
		return exec.AsValue(fmt.Errorf("tojson: positional arguments are not supported"))
	}
	for k, v := range params.KwArgs {
		switch k {
		case "indent":
			if v.IsNil() {
				continue
			}
			if !v.IsInteger() {
				return exec.AsValue(fmt.Errorf("tojson: indent must be an integer"))
			}
			o.hasIndent, o.indent, o.itemSep = true, strings.Repeat(" ", v.Integer()), ","
		case "ensure_ascii":
			o.ensureASCII = v.IsTrue()
		case "sort_keys":
			o.sortKeys = v.IsTrue()
		case "separators":
			if !v.IsList() || v.Len() != 2 {
				return exec.AsValue(fmt.Errorf("tojson: separators must be a pair of strings"))
			}
		default:
			return exec.AsValue(fmt.Errorf("tojson: unsupported argument %q", k))
		}
	}
	if sep, ok := params.KwArgs["separators"]; ok {
		o.itemSep, o.keySep = sep.Index(0).String(), sep.Index(1).String()
	}
	var b strings.Builder
	if err := writeJSON(&b, in, &o, 0); err != nil {
		return exec.AsValue(err)
	}
	return exec.AsSafeValue(b.String())
}

// strftime formats t with the C strftime directives templates use for the
// date in a system prompt (Llama 3's "%d %b %Y").
func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 == len(format) {
			b.WriteByte(c)
			continue
		}
		i++
		switch format[i] {
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'Y':
			fmt.Fprintf(&b, "%d", t.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'b':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(format[i])
		}
	}
	return b.String()
}
