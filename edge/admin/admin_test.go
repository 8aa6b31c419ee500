package admin

import "testing"

func TestBearerToken(t *testing.T) {
	for h, want := range map[string]string{"Bearer abc": "abc", "bearer abc": "abc", "BeArEr  abc ": "abc", "Basic abc": "", "Bearer": "", "Bearer ": "", "": ""} {
		got, ok := bearerToken(h)
		if got != want || ok != (want != "") {
			t.Errorf("bearerToken(%q) = %q, %v; want %q", h, got, ok, want)
		}
	}
}
