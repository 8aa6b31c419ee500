package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// stopSignal is the cause of the context stopOnSignals cancels.
type stopSignal struct{ sig os.Signal }

func (s stopSignal) Error() string { return fmt.Sprintf("stopped by %v", s.sig) }

// stopOnSignals returns a context cancelled (cause: a stopSignal) by SIGINT,
// SIGTERM, SIGHUP (the terminal closed), or SIGPIPE when standard output
// or standard error is a pipe whose reader went away (`make run | tee log`
// after Ctrl-C): each stops like SIGINT, a drain and a clean exit. Without
// notifying SIGPIPE, the Go runtime kills the process on a write to a
// closed stdout, skipping the shutdown and leaving tether dev's temporary
// directory (CA key included) behind.
//
// Notifying SIGPIPE also delivers the one the kernel raises on a write to
// a TCP connection its peer reset (EPIPE): a client that hangs up while an
// edge streams to it, or a Raft peer that died (test/chaos kill-leader:
// the surviving edges stopped one after the other and the cluster lost
// its quorum). Such a SIGPIPE is not a reason to stop (the write
// already failed with an error the server handles), so a SIGPIPE stops
// only while stdout or stderr is broken.
func stopOnSignals(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case sig := <-sigs:
				if sig == syscall.SIGPIPE && !stdioBroken() {
					continue
				}
				cancel(stopSignal{sig})
				return
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			signal.Stop(sigs)
			close(done)
			cancel(context.Canceled)
		})
	}
}

// stdioBroken reports whether standard output or standard error is a pipe
// or socket whose reader went away.
func stdioBroken() bool {
	return writeEndBroken(os.Stdout.Fd()) || writeEndBroken(os.Stderr.Fd())
}
