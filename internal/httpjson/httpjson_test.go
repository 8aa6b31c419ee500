package httpjson

import (
	"net/http/httptest"
	"testing"
)

func TestClip(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{{"short", 10, "short"}, {"abcdef", 3, "abc…"}, {"añb", 2, "a…"}, {"", 0, ""}} {
		if got := Clip(c.s, c.n); got != c.want {
			t.Errorf("Clip(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
}

func TestWrite(t *testing.T) {
	rec := httptest.NewRecorder()
	Write(rec, 418, map[string]int{"a": 1})
	if rec.Code != 418 || rec.Header().Get("Content-Type") != "application/json" || rec.Body.String() != "{\"a\":1}\n" {
		t.Fatalf("%d %q %q", rec.Code, rec.Header(), rec.Body)
	}
}
