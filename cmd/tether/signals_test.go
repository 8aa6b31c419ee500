package main

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A SIGPIPE from a write to a broken connection (a Raft peer or a client
// that went away) must not stop the process; one from a broken stdout and
// every other stop signal must. Before, any SIGPIPE stopped it: an edge
// shut down whenever a peer died (test/chaos kill-leader).
func TestSIGPIPEStopsOnlyWhenStdioIsBroken(t *testing.T) {
	run := func(broken bool, sigs ...os.Signal) (cancelled bool, ignored int) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch := make(chan os.Signal, len(sigs))
		for _, s := range sigs {
			ch <- s
		}
		done := make(chan struct{})
		n := 0
		go func() {
			defer close(done)
			watchStop(ctx, cancel, ch, func() bool { return broken }, func(os.Signal) {
				n++
				if n == len(sigs) {
					cancel() // every signal seen and ignored: stop watching
				}
			})
		}()
		<-done
		return n < len(sigs), n
	}
	if stopped, ignored := run(false, syscall.SIGPIPE, syscall.SIGPIPE); stopped || ignored != 2 {
		t.Fatalf("SIGPIPE with a working stdout: stopped=%v ignored=%d, want ignored", stopped, ignored)
	}
	for _, s := range []os.Signal{syscall.SIGTERM, syscall.SIGHUP, os.Interrupt} {
		if stopped, _ := run(false, s); !stopped {
			t.Fatalf("%v did not stop", s)
		}
	}
	if stopped, _ := run(true, syscall.SIGPIPE); !stopped {
		t.Fatal("SIGPIPE with a broken stdout did not stop")
	}
}

func TestBrokenWriter(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if brokenWriter(int(w.Fd())) {
		t.Fatal("a pipe with its reader open reported broken")
	}
	r.Close()
	if !brokenWriter(int(w.Fd())) {
		t.Fatal("a pipe whose reader closed not reported broken")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if brokenWriter(int(f.Fd())) {
		t.Fatal("a regular file reported broken")
	}
}
