package e2e

import (
	"fmt"
	"os"
	"testing"

	"github.com/tether-project/tether/test/leakcheck"
	"github.com/tether-project/tether/test/testbin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Remove()
	if code == 0 {
		if err := leakcheck.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: goroutines left running:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// tetherBin is the tether binary, built on first use.
func tetherBin(t *testing.T) string {
	t.Helper()
	path, err := testbin.Tether()
	if err != nil {
		t.Fatal(err)
	}
	return path
}
