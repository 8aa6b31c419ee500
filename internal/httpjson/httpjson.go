// Package httpjson writes JSON answers and quotes client input in their
// messages, the same way in the edge, its admin API and the worker.
package httpjson

import (
	"encoding/json"
	"net/http"
	"unicode/utf8"
)

// Write answers status with v encoded as JSON.
func Write(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Clip shortens s to at most n bytes, cut at a character boundary, and
// marks the cut with "…": client input quoted in an error message stays
// bounded and valid UTF-8.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
