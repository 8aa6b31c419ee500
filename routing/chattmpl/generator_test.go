package chattmpl

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// The committed fixture is what the JavaScript reference produces today:
// chat.mjs runs (from an npm install cached by its lock file) and must
// write the same bytes. Skipped without node and npm, or when the install
// fails (no registry): the Go tests above never need node.
func TestGoldenFixtureReproduces(t *testing.T) {
	if testing.Short() {
		t.Skip("runs npm and node")
	}
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: the JavaScript reference cannot run (%v)", tool, err)
		}
	}
	gen := filepath.Join("..", "hftok", "testdata", "gen")
	lock, err := os.ReadFile(filepath.Join(gen, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(lock)
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "tether-test", "chat-golden-"+hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Skipf("no cache directory for the npm install: %v", err)
	}
	for _, name := range []string{"package.json", "package-lock.json", "chat.mjs"} {
		data, err := os.ReadFile(filepath.Join(gen, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	marker := filepath.Join(dir, "installed.ok") // written after a complete install
	if _, err := os.Stat(marker); err != nil {
		cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Skipf("npm ci of the reference failed (%v):\n%s", err, out)
		}
		if err := os.WriteFile(marker, nil, 0o644); err != nil {
			t.Fatal(err)
		}
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
