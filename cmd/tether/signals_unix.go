//go:build unix

package main

import "golang.org/x/sys/unix"

// writeEndBroken reports whether fd is the write end of a pipe (or a
// socket) with no reader left: poll flags it with POLLERR (or POLLHUP)
// without blocking. A terminal, a file or /dev/null never is.
func writeEndBroken(fd uintptr) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n == 1 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0
}
