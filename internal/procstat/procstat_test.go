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
