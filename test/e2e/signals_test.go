package e2e

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// `tether dev` with its stdout piped to a reader that went away (`make run
// | tee log` and Ctrl-C; a closed terminal) drains and exits cleanly, and
// its temporary directory, CA private key included, is gone. Before, the
// first write to the closed pipe killed it by SIGPIPE mid-shutdown and
// SIGHUP killed it outright, leaving the directory behind.
func TestDevSurvivesClosedStdoutAndHangup(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := exec.Command(tetherBin(t), "dev", "--port", "0", "--edges", "1", "--ready-timeout", readyTimeout.String())
			stderr := &lockedBuffer{}
			cmd.Stderr = stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			dataDir := ""
			sc := bufio.NewScanner(out)
			ready := false
			for !ready && sc.Scan() {
				line := sc.Text()
				if v, ok := strings.CutPrefix(line, "data dir:"); ok {
					dataDir = strings.Fields(v)[0]
				}
				ready = strings.HasPrefix(line, "tether dev: ready")
			}
			if !ready || dataDir == "" {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("not ready (data dir %q); stderr:\n%s", dataDir, tail(stderr.String(), 40))
			}
			if _, err := os.Stat(dataDir + "/tls/ca-key.pem"); err != nil {
				t.Logf("(no %s/tls/ca-key.pem to watch: %v)", dataDir, err)
			}
			// The reader goes away, then the signal: every later write to
			// stdout hits a closed pipe.
			if err := out.Close(); err != nil {
				t.Fatal(err)
			}
			go func() { exited <- cmd.Wait() }()
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-exited:
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					t.Fatalf("exit %v after %v with stdout closed; stderr:\n%s", ee.ProcessState, sig, tail(stderr.String(), 40))
				}
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(exitTimeout):
				_ = cmd.Process.Kill()
				t.Fatalf("still running %s after %v", exitTimeout, sig)
			}
			if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("temporary data dir %s left behind (%v)", dataDir, err)
			}
		})
	}
}
