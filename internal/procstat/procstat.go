// Package procstat reads what the kernel says of this process's CPU: the
// CPU time it used (getrusage) and the time its threads waited on a run
// queue for a CPU (the run delay of /proc/self/task/*/schedstat, Linux).
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
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			continue // the thread exited
		}
		f := bytes.Fields(b)
		if len(f) < 2 {
			continue
		}
		n, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil || n < 0 {
			continue
		}
		total += n
		seen = true
	}
	return time.Duration(total), seen
}

// Load is what a window between two samples says: the CPUs the process
// used on average (CPU time over wall time) and the threads waiting for
// one (run delay over wall time).
type Load struct {
	Used, Waiting float64
}

// Between is the load from a to b over wall time wall.
func Between(a, b Sample, wall time.Duration) Load {
	if wall <= 0 {
		return Load{}
	}
	l := Load{Used: float64(b.CPU-a.CPU) / float64(wall)}
	if a.HasRunDelay && b.HasRunDelay {
		l.Waiting = float64(b.RunDelay-a.RunDelay) / float64(wall)
	}
	return l
}
