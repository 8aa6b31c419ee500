package main

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// A write to a TCP connection whose peer went away fails with EPIPE and
// raises SIGPIPE. That is a client hanging up, not a reason to stop: the
// process keeps running and stops on the next real signal. Before, every
// notified SIGPIPE stopped it, so one client closing a stream mid-answer
// shut a whole tether dev down (test/e2e TestOpenAIClientThroughTetherDev
// then met "connection refused" on its next call).
func TestSocketBrokenPipeDoesNotStop(t *testing.T) {
	if stdioBroken() {
		t.Skip("the test's own stdout or stderr is a broken pipe")
	}
	ctx, stop := stopOnSignals(context.Background())
	defer stop()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	client.Close()
	// The first write after the peer's close draws its reset; a later one
	// fails with EPIPE, which is when the kernel raises SIGPIPE.
	deadline := time.Now().Add(30 * time.Second)
	buf := make([]byte, 4096)
	for {
		_, err := server.Write(buf)
		if errors.Is(err, syscall.EPIPE) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no EPIPE from writing to a closed peer within 30s (last error %v)", err)
		}
	}

	// SIGTERM after the SIGPIPE: the stop's cause says which one stopped
	// it (the runtime hands the process's signals to the channel in order,
	// and a SIGPIPE pending beside a SIGTERM comes first).
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("SIGTERM did not stop within 30s")
	}
	if got, want := context.Cause(ctx), (stopSignal{syscall.SIGTERM}); got != want {
		t.Fatalf("%v, want %v", got, want)
	}
}

// stdout piped to a reader that went away is what a SIGPIPE stops for.
func TestWriteEndBrokenWhenTheReaderGoesAway(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if writeEndBroken(w.Fd()) {
		t.Fatal("a pipe with its reader open reported broken")
	}
	r.Close()
	if !writeEndBroken(w.Fd()) {
		t.Fatal("a pipe whose reader closed not reported broken")
	}
	f, err := os.Create(t.TempDir() + "/out")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if writeEndBroken(f.Fd()) {
		t.Fatal("a regular file reported broken")
	}
}
