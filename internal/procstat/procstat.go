// Package procstat reads what the kernel says of this process's CPU: the
// CPU time it used (getrusage), the time its threads waited on a run queue
// for a CPU (the run delay of /proc/self/task/*/schedstat, Linux) and the
// CPU its cgroup may use (cpu.max, or cpu.cfs_quota_us under cgroup v1).
// An edge tells its own CPU demand from its neighbours' with them: a
// process that uses the CPU it may is busy with its own work; one whose
// threads wait for a CPU it does not get is starved by others.
package procstat

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Sample is the process's CPU use and run-queue wait, cumulative since it
// started.
type Sample struct {
	// CPU is user plus system CPU time of every thread.
	CPU time.Duration
	// RunDelay is the time the threads were runnable but waited for a
	// CPU; HasRunDelay is false where the kernel does not report it.
	RunDelay    time.Duration
	HasRunDelay bool
}

// Read samples the process now.
func Read() (Sample, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return Sample{}, err
	}
	s := Sample{CPU: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
	s.RunDelay, s.HasRunDelay = runDelay("/proc/self/task")
	return s, nil
}

// runDelay sums the second field (run-queue wait, nanoseconds) of every
// thread's schedstat under dir.
func runDelay(dir string) (time.Duration, bool) {
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, false
	}
	var total int64
	seen := false
	buf := make([]byte, 128)
	for _, t := range tasks {
		n, ok := schedstatDelay(filepath.Join(dir, t.Name(), "schedstat"), buf)
		if !ok {
			continue // the thread exited, or a line not understood
		}
		total += n
		seen = true
	}
	return time.Duration(total), seen
}

// schedstatDelay is the run delay of one schedstat file ("run_ns delay_ns
// timeslices"), read into buf.
func schedstatDelay(path string, buf []byte) (int64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	n, err := f.Read(buf)
	f.Close()
	if err != nil || n == 0 {
		return 0, false
	}
	fields := bytes.Fields(buf[:n])
	if len(fields) < 2 {
		return 0, false
	}
	d, err := strconv.ParseInt(string(fields[1]), 10, 64)
	if err != nil || d < 0 {
		return 0, false
	}
	return d, true
}

// Load is what a window between two samples says: the CPUs the process
// used on average (CPU time over wall time) and the threads waiting for
// one (run delay over wall time).
type Load struct {
	Used, Waiting float64
	// HasWaiting: both samples had a run delay.
	HasWaiting bool
}

// Between is the load from a to b over wall time wall. A thread that
// exits takes its run delay out of the sum: a window in which the sum fell
// counts no wait.
func Between(a, b Sample, wall time.Duration) Load {
	if wall <= 0 {
		return Load{}
	}
	l := Load{Used: max(0, float64(b.CPU-a.CPU)/float64(wall))}
	if a.HasRunDelay && b.HasRunDelay {
		l.Waiting = max(0, float64(b.RunDelay-a.RunDelay)/float64(wall))
		l.HasWaiting = true
	}
	return l
}

// WaitPerCPU is the run-queue wait per CPU-second used (0 when the window
// used none or had no run delay): near 0 for a process the CPUs run as
// soon as it is runnable, high for one whose threads queue behind others.
func (l Load) WaitPerCPU() float64 {
	if !l.HasWaiting || l.Used <= 0 {
		return 0
	}
	return l.Waiting / l.Used
}
