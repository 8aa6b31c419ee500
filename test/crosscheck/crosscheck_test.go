package crosscheck

import (
	"fmt"
	"runtime"
	"testing"
)

// ended records how a test ended through Unavailable.
type ended struct {
	testing.TB
	how, msg string
}

func (e *ended) Helper() {}
func (e *ended) Fatalf(format string, args ...any) {
	e.how, e.msg = "failed", fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (e *ended) Skipf(format string, args ...any) {
	e.how, e.msg = "skipped", fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func run(f func(testing.TB)) *ended {
	e := &ended{}
	done := make(chan struct{})
	go func() { defer close(done); f(e) }()
	<-done
	return e
}

func TestUnavailableFailsInCI(t *testing.T) {
	t.Setenv("CI", "true")
	if e := run(func(tb testing.TB) { Unavailable(tb, "no %s", "node") }); e.how != "failed" || e.msg != "cross-check cannot run, and CI requires it: no node" {
		t.Fatalf("in CI: %s %q", e.how, e.msg)
	}
	t.Setenv("CI", "")
	if e := run(func(tb testing.TB) { Unavailable(tb, "no %s", "node") }); e.how != "skipped" {
		t.Fatalf("outside CI: %s %q", e.how, e.msg)
	}
	t.Setenv("PATH", "")
	t.Setenv("CI", "1")
	if e := run(func(tb testing.TB) { Python3(tb) }); e.how != "failed" {
		t.Fatalf("python3 missing in CI: %s %q", e.how, e.msg)
	}
}
