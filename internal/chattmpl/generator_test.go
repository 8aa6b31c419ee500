package chattmpl

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-project/tether/test/crosscheck"
	"github.com/tether-project/tether/test/npmenv"
)

// The committed fixture is what the JavaScript reference produces today:
// chat.mjs runs (from an npm install cached by its lock file) and must
// write the same bytes. Without node and npm, or when the install fails
// (no registry), it is skipped, or fails in CI (test/crosscheck): the Go
// tests above never need node.
func TestGoldenFixtureReproduces(t *testing.T) {
	if testing.Short() {
		t.Skip("runs npm and node")
	}
	gen := filepath.Join("..", "hftok", "testdata", "gen")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir, err := npmenv.Install(ctx, gen, "chat-golden", "package.json", "package-lock.json", "chat.mjs", "render.mjs", "dialects.mjs")
	if err != nil {
		crosscheck.Unavailable(t, "the JavaScript reference cannot run: %v", err)
	}
	cfg, err := filepath.Abs(filepath.Join("..", "hftok", "testdata", "qwen3", "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "golden.json")
	cmd := exec.CommandContext(ctx, "node", "chat.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "TETHER_QWEN3_CONFIG="+cfg, "TETHER_CHAT_GOLDEN="+out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("node chat.mjs: %v\n%s", err, msg)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join("testdata", "qwen3_chat_golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the reference now writes a different fixture (%d bytes, committed %d): regenerate with node chat.mjs in %s and review the diff", len(got), len(want), gen)
	}
}
