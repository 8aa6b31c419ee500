package main

import (
	"errors"
	"flag"
	"strings"
	"testing"
)

// --since and --until are RFC 3339 times, --until after --since; anything
// else is a usage error naming the flag.
func TestAuditWindowFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // "" accepted
	}{
		{nil, ""},
		{[]string{"--since", "2026-01-01T00:00:00Z", "--until", "2026-01-01T01:00:00Z"}, ""},
		{[]string{"--since", "yesterday"}, "--since"},
		{[]string{"--until", "2026-13-01T00:00:00Z"}, "--until"},
		{[]string{"--since", "2026-01-01T01:00:00Z", "--until", "2026-01-01T00:00:00Z"}, "--until must be after --since"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		w := addWindowFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		o, err := w.options()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.want != "" && (err == nil || !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v, want a usage error naming %s", tc.args, err, tc.want)
		case tc.want == "" && len(tc.args) > 0 && (o.Since.IsZero() || o.Until.IsZero()):
			t.Errorf("%v: window %+v", tc.args, o)
		}
	}
}
