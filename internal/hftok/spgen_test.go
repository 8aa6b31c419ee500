package hftok

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-project/tether/test/npmenv"
)

// The committed SentencePiece fixtures are what the JavaScript references
// produce today: build.mjs runs (from an npm install cached by its lock
// file) and must write the same golden ids and tokenizer files. Without
// node or the registry it skips, except in CI (CI set), where a missing
// cross-check fails.
func TestSentencePieceFixturesReproduce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs npm and node")
	}
	gen := filepath.Join("testdata", "spgen")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir, err := npmenv.Install(ctx, gen, "sentencepiece-golden", "package.json", "package-lock.json", "build.mjs", "prompts.mjs")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the JavaScript reference cannot run in CI: %v", err)
		}
		t.Skipf("the JavaScript reference cannot run: %v", err)
	}
	out := t.TempDir()
	cmd := exec.CommandContext(ctx, "node", "build.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "TETHER_SP_OUT="+out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("node build.mjs: %v\n%s", err, msg)
	}
	same := func(rel string, gunzip bool) {
		t.Helper()
		read := func(p string) []byte {
			if gunzip {
				return loadRaw(t, p)
			}
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		if got, want := read(filepath.Join(out, rel)), read(filepath.Join("testdata", rel)); !bytes.Equal(got, want) {
			t.Fatalf("%s: the reference now writes something else (%d bytes, committed %d): regenerate with node build.mjs in %s", rel, len(got), len(want), gen)
		}
	}
	same("mistral_golden.json", false)
	same(filepath.Join("mistral", "tokenizer.json.gz"), true)
	same(filepath.Join("mistral-legacy", "tokenizer.json.gz"), true)
}
