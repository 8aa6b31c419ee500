// Package repo finds the repository a test runs in, for tests that read
// the tree itself (the import graph, function lengths).
package repo

import (
	"os"
	"path/filepath"
	"testing"
)

// Root is the directory of the go.mod above the test's working directory.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
