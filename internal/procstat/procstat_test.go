package procstat

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// A busy goroutine shows as CPU used; on Linux the run delay is read.
func TestReadSeesOwnCPU(t *testing.T) {
	a, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for time.Since(start) < 50*time.Millisecond {
	}
	b, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	if b.CPU <= a.CPU {
		t.Fatalf("CPU %s → %s after a busy loop", a.CPU, b.CPU)
	}
	if runtime.GOOS == "linux" && !b.HasRunDelay {
		t.Fatal("no run delay read on Linux")
	}
	if l := Between(a, b, time.Since(start)); l.Used <= 0 || l.Waiting < 0 {
		t.Fatalf("load %+v", l)
	}
}

// schedstat files are summed over threads; a malformed one is skipped.
func TestRunDelaySumsThreads(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"1": "100 2000 3\n", "2": "5 500 1\n", "3": "garbage\n"} {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "schedstat"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if d, ok := runDelay(dir); !ok || d != 2500 {
		t.Fatalf("run delay %d (%v), want 2500 ns", d, ok)
	}
	if _, ok := runDelay(filepath.Join(dir, "none")); ok {
		t.Fatal("a missing directory read as a delay")
	}
	if l := Between(Sample{CPU: 0, RunDelay: 0, HasRunDelay: true}, Sample{CPU: time.Second, RunDelay: 500 * time.Millisecond, HasRunDelay: true}, 2*time.Second); l.Used != 0.5 || l.Waiting != 0.25 {
		t.Fatalf("between: %+v", l)
	}
}

// A thread that exits takes its run delay out of the sum: the window
// counts no wait rather than a negative one.
func TestBetweenClampsAnExitedThreadsDelay(t *testing.T) {
	l := Between(Sample{CPU: time.Second, RunDelay: time.Second, HasRunDelay: true},
		Sample{CPU: 2 * time.Second, RunDelay: 500 * time.Millisecond, HasRunDelay: true}, time.Second)
	if l.Used != 1 || l.Waiting != 0 || !l.HasWaiting || l.WaitPerCPU() != 0 {
		t.Fatalf("load %+v", l)
	}
	if l := Between(Sample{}, Sample{CPU: time.Second}, time.Second); l.HasWaiting || l.WaitPerCPU() != 0 {
		t.Fatalf("no run delay read, load %+v", l)
	}
}

// The CPU limit is the tightest quota of the process's cgroup and its
// parents, under cgroup v2 (cpu.max) and v1 (cfs quota and period).
func TestCPULimitReadsTheCgroupQuota(t *testing.T) {
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name   string
		cgroup string
		files  map[string]string
		want   float64
		ok     bool
	}{
		{"v2 pod limit", "0::/kubepods/pod1/c1\n", map[string]string{
			"kubepods/pod1/c1/cpu.max": "max 100000\n", "kubepods/pod1/cpu.max": "150000 100000\n", "kubepods/cpu.max": "400000 100000\n"}, 1.5, true},
		{"v2 no limit", "0::/a\n", map[string]string{"a/cpu.max": "max 100000\n", "cpu.max": "max 100000\n"}, 0, false},
		{"v2 namespaced", "0::/\n", map[string]string{"cpu.max": "50000 100000\n"}, 0.5, true},
		{"hybrid unified", "1:cpu:/\n0::/x\n", map[string]string{"unified/x/cpu.max": "200000 100000\n", "cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2, true},
		{"v1 quota", "4:memory:/m\n3:cpu,cpuacct:/docker/abc\n", map[string]string{
			"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000\n", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"}, 2.5, true},
		{"v1 unlimited", "3:cpu:/\n", map[string]string{"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0, false},
		{"garbage", "0::/g\nnot a line\n", map[string]string{"g/cpu.max": "lots\n"}, 0, false},
	} {
		root := t.TempDir()
		for p, content := range c.files {
			write(filepath.Join(root, "fs", p), content)
		}
		write(filepath.Join(root, "cgroup"), c.cgroup)
		got, ok := cpuLimit(filepath.Join(root, "cgroup"), filepath.Join(root, "fs"))
		if got != c.want || ok != c.ok {
			t.Errorf("%s: limit %v (%v), want %v (%v)", c.name, got, ok, c.want, c.ok)
		}
	}
	if _, ok := cpuLimit(filepath.Join(t.TempDir(), "none"), "/nonexistent"); ok {
		t.Error("a limit without a cgroup file")
	}
}
