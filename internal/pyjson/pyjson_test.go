package pyjson

import (
	"math"
	"strings"
	"testing"
)

// Each case is what Python 3's json.dumps(value) and
// json.dumps(value, ensure_ascii=False) print.
func TestWriteString(t *testing.T) {
	for _, c := range []struct{ in, ascii, raw string }{
		{"plain", `"plain"`, `"plain"`},
		{"a\"b\\c\n\r\t\b\f", `"a\"b\\c\n\r\t\b\f"`, `"a\"b\\c\n\r\t\b\f"`},
		{"\x01\x1f", `"\u0001\u001f"`, `"\u0001\u001f"`},
		{"del\x7f", `"del\u007f"`, "\"del\x7f\""},
		{"é", `"\u00e9"`, `"é"`},
		{"😀", `"\ud83d\ude00"`, `"😀"`},
	} {
		for _, m := range []struct {
			ensure bool
			want   string
		}{{true, c.ascii}, {false, c.raw}} {
			var b strings.Builder
			WriteString(&b, c.in, m.ensure)
			if b.String() != m.want {
				t.Errorf("WriteString(%q, ensure_ascii=%v) = %s, want %s", c.in, m.ensure, b.String(), m.want)
			}
		}
	}
}

// Python's repr of floats.
func TestFloat(t *testing.T) {
	for f, want := range map[float64]string{1: "1.0", 0.1: "0.1", 1e16: "1e+16", 1e15: "1000000000000000.0", 1e-5: "1e-05",
		0.0001: "0.0001", 1.5e300: "1.5e+300", math.Inf(1): "Infinity", math.Inf(-1): "-Infinity"} {
		if got := Float(f); got != want {
			t.Errorf("Float(%v) = %s, want %s", f, got, want)
		}
	}
	if Float(math.NaN()) != "NaN" {
		t.Error("NaN")
	}
	for n, want := range map[string]string{"7": "7", "-3": "-3", "2.50": "2.5", "1E3": "1000.0"} {
		if got := Number(n); got != want {
			t.Errorf("Number(%s) = %s, want %s", n, got, want)
		}
	}
}
