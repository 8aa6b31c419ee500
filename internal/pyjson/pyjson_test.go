package pyjson

import (
	"encoding/json"
	"strings"
	"testing"
)

// Tool call arguments carry the bytes vLLM's json.dumps writes (outputs of
// Python 3's json.dumps(json.loads(in))).
func TestDumps(t *testing.T) {
	for in, want := range map[string]string{
		`{"b":1,"a":[1.0,2.5e-7,1e16,100000.0,123456789012345678.0,0.0001,-0.0],"c":{"z":null,"y":true},"u":"hé € 😀 \n\t\u0001\u007f/<>&"}`: `{"b": 1, "a": [1.0, 2.5e-07, 1e+16, 100000.0, 1.2345678901234568e+17, 0.0001, -0.0], "c": {"z": null, "y": true}, "u": "h\u00e9 \u20ac \ud83d\ude00 \n\t\u0001\u007f/<>&"}`,
		`{}`: `{}`, `[]`: `[]`, `{"k":{}}`: `{"k": {}}`, `{"file_path":"passes"}`: `{"file_path": "passes"}`,
		// Beyond a float64, Python reads infinities.
		`{"x":1e999,"y":-1e999,"z":1e-999}`: `{"x": Infinity, "y": -Infinity, "z": 0.0}`,
	} {
		if got := Dumps(json.RawMessage(in)); got != want {
			t.Errorf("Dumps(%s)\n got %s\nwant %s", in, got, want)
		}
	}
}

// json.dumps(s, ensure_ascii=False) escapes only the control characters,
// the quote and the backslash; ensure_ascii escapes DEL too.
func TestQuote(t *testing.T) {
	for _, c := range []struct {
		in    string
		ascii bool
		want  string
	}{
		{"h\u00e9\x7f\x01", false, "\"h\u00e9\x7f\\u0001\""},
		{"h\u00e9\x7f\x01", true, `"h\u00e9\u007f\u0001"`},
	} {
		var b strings.Builder
		Quote(&b, c.in, c.ascii)
		if b.String() != c.want {
			t.Errorf("Quote(%q, ensure_ascii=%v) = %s, want %s", c.in, c.ascii, b.String(), c.want)
		}
	}
}
