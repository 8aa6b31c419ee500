package agents

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-project/tether/ops/devstack"
	"github.com/tether-project/tether/test/repo"
)

// readmeBlock is the fenced code block of README.md after the comment
// <!-- marker -->, with the dev stack's first edge, CA and model in place
// of README's localhost:8000, $CA and tether-sim.
func readmeBlock(t *testing.T, st *devstack.Stack, edge, marker string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repo.Root(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(raw), "<!-- "+marker+" -->\n```")
	if !ok {
		t.Fatalf("README.md has no %s block", marker)
	}
	_, rest, _ = strings.Cut(rest, "\n") // the fence's language
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatalf("README.md's %s block does not end", marker)
	}
	return strings.NewReplacer("https://localhost:8000", edge, "$CA", st.CAFile(), "tether-sim", st.Model()).Replace(block)
}

// exports are the VAR=value assignments of a block's export lines (with
// backslash continuations), as a command's environment.
func exports(t *testing.T, block string) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(strings.ReplaceAll(block, "\\\n", " "), "\n") {
		words, ok := strings.CutPrefix(strings.TrimSpace(line), "export ")
		if !ok {
			continue
		}
		for _, w := range strings.Fields(words) {
			if !strings.Contains(w, "=") {
				t.Fatalf("README export %q is not VAR=value", w)
			}
			out = append(out, w)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no export in README block:\n%s", block)
	}
	return out
}
