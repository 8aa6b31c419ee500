// Package testbin builds the tether binary for the tests that run it as a
// process (test/e2e, test/ops, test/chaos): once per test process, into a
// temporary directory that Remove deletes.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/tether-project/tether/test/leakcheck"
)

var (
	once sync.Once
	dir  string
	path string
	err  error
)

// Tether returns the path of the tether binary, building it on the first
// call (only the tests that run it pay for the build). go test puts its own
// go command first on PATH; the package path builds from any directory of
// the module. TETHER_TEST_BINARY names a prebuilt binary instead (to run a
// suite against another build, e.g. to show a test fails before a fix).
func Tether() (string, error) {
	once.Do(func() {
		if p := os.Getenv("TETHER_TEST_BINARY"); p != "" {
			path = p
			return
		}
		if dir, err = os.MkdirTemp("", "tether-bin-*"); err != nil {
			return
		}
		path = filepath.Join(dir, "tether")
		// Built as the image's binary is (Makefile build-static: no
		// cgo, trimmed paths), so the tests run what ships and share its
		// compiled packages with test/image's build.
		build := exec.Command("go", "build", "-trimpath", "-o", path, "github.com/tether-project/tether/cmd/tether")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, berr := build.CombinedOutput(); berr != nil {
			err = fmt.Errorf("go build ./cmd/tether: %v\n%s", berr, out)
		}
	})
	return path, err
}

// Remove deletes the built binary, if any (call it from TestMain after
// m.Run).
func Remove() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}

// T returns the path of the tether binary, failing t when it cannot be
// built.
func T(t testing.TB) string {
	t.Helper()
	p, err := Tether()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Main is the TestMain of a package whose tests run the tether binary:
// it runs them, deletes the binary, and fails a passing run that left
// goroutines behind (named after pkg).
func Main(m *testing.M, pkg string) {
	code := m.Run()
	Remove()
	if code == 0 {
		if err := leakcheck.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "%s: goroutines left running: %v\n", pkg, err)
			code = 1
		}
	}
	os.Exit(code)
}
