package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// stopSignals returns a context cancelled by SIGINT, SIGTERM, SIGHUP (the
// terminal closed), or SIGPIPE when standard output or error is a pipe or
// socket whose reader went away (`make run | tee log` after Ctrl-C): a
// drain and a clean exit. SIGPIPE must be notified, or the Go runtime kills
// the process on a write to a closed stdout, skipping the shutdown and
// leaving tether dev's temporary directory (CA key included) behind.
//
// But once SIGPIPE is notified, the runtime delivers it for a write to any
// broken connection, not only stdout: a Raft peer or an HTTP client that
// reset its connection. Treated as a stop, that shut an edge down whenever
// a peer died (test/chaos kill-leader: the surviving edges stopped one
// after the other and the cluster lost its quorum). So SIGPIPE stops only
// when stdout or stderr is really broken; otherwise the failed write has
// already returned EPIPE to its caller, which handles it.
func stopSignals() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	go watchStop(ctx, cancel, sigs, func() bool { return brokenWriter(1, 2) }, nil)
	return ctx, func() {
		signal.Stop(sigs)
		cancel()
	}
}

// watchStop cancels on the first stop signal from sigs; a SIGPIPE counts
// only while stdioBroken says so (ignored, if set, sees the others).
func watchStop(ctx context.Context, cancel context.CancelFunc, sigs <-chan os.Signal, stdioBroken func() bool, ignored func(os.Signal)) {
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-sigs:
			if s == syscall.SIGPIPE && !stdioBroken() {
				if ignored != nil {
					ignored(s)
				}
				continue
			}
			cancel()
			return
		}
	}
}

// brokenWriter reports whether any of fds is the write end of a pipe or
// socket whose reader is gone (poll reports an error or a hang-up). A
// regular file or a terminal never is.
func brokenWriter(fds ...int) bool {
	pfds := make([]unix.PollFd, len(fds))
	for i, fd := range fds {
		pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLOUT}
	}
	if _, err := unix.Poll(pfds, 0); err != nil {
		return false
	}
	for _, f := range pfds {
		if f.Revents&(unix.POLLERR|unix.POLLHUP) != 0 {
			return true
		}
	}
	return false
}
