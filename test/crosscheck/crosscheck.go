// Package crosscheck decides what a test does when an independent
// cross-check cannot run here (python3's hmac and json for the hint
// vectors, node for the tokenizer, chat-template and KV-event references,
// the OpenAI Agents SDK from npm): on a developer's machine it skips, and
// says why; in CI (the CI environment variable set, as CI services set it
// and `.ci/run` does) it fails, because a cross-check that silently did not
// run proves nothing. `.ci/run` installs python3, node and npm first.
package crosscheck

import (
	"os"
	"os/exec"
	"testing"
)

// Required reports whether every cross-check must run (CI is set).
func Required() bool { return os.Getenv("CI") != "" }

// Unavailable ends t because a cross-check cannot run: a skip, or a
// failure when Required.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if Required() {
		t.Fatalf("cross-check cannot run, and CI requires it: "+format, args...)
	}
	t.Skipf("cross-check skipped: "+format, args...)
}

// Python3 is the python3 to run a cross-check with; Unavailable when it is
// not installed.
func Python3(t testing.TB) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		Unavailable(t, "python3 is not installed: %v", err)
	}
	return py
}
