package main

import (
	"strings"
	"testing"
)

// The banner's note on the admin token says where it came from: a given
// token is not stored, a temporary data dir does not outlive the run.
func TestAdminTokenNote(t *testing.T) {
	for _, c := range []struct {
		source string
		temp   bool
		want   string
	}{
		{"given", false, "not stored"},
		{"given", true, "not stored"},
		{"generated", true, "for this run"},
		{"generated", false, "kept in the data dir for the next start"},
		{"kept", false, "kept in the data dir from an earlier run"},
	} {
		if got := adminTokenNote(c.source, c.temp); !strings.Contains(got, c.want) {
			t.Errorf("source %s, temporary dir %v: %q, want it to say %q", c.source, c.temp, got, c.want)
		}
	}
}
