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
// the module.
func Tether() (string, error) {
	once.Do(func() {
		if dir, err = os.MkdirTemp("", "tether-bin-*"); err != nil {
			return
		}
		path = filepath.Join(dir, "tether")
		build := exec.Command("go", "build", "-o", path, "github.com/tether-project/tether/cmd/tether")
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
