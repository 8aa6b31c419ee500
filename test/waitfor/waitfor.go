// Package waitfor is the one condition-polling helper of the repository's
// tests: wait on a condition with a deadline, never a sleep-to-pass.
package waitfor

import (
	"testing"
	"time"
)

// poll is short enough that a met condition costs a test almost nothing and
// long enough that a busy condition (an HTTP call, a cluster read) does not
// spin a core.
const poll = 5 * time.Millisecond

// True polls cond until it holds, failing the test after timeout.
func True(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	Reason(t, timeout, what, func() string {
		if cond() {
			return ""
		}
		return "not yet"
	})
}

// Reason polls cond until it returns "", failing the test after timeout with
// the last reason it gave.
func Reason(t testing.TB, timeout time.Duration, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %s", timeout, what, why)
		}
		time.Sleep(poll)
	}
}
