package tokenize

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/test/npmenv"
)

type dialectGolden struct {
	Name string          `json:"name"`
	Path string          `json:"path"`
	Body json.RawMessage `json:"body"`
	IDs  []uint32        `json:"ids"`
}

// With hf:<dir>, the edge's block keys for a Messages or Responses request
// are the chained hashes of the token ids the JavaScript reference gives
// the chat messages vLLM converts the request to (dialects.mjs: its own
// implementation of vLLM's conversions), token for token.
func TestDialectKeysMatchTheReference(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "qwen3_dialects_golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Cases []dialectGolden `json:"cases"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	fs := contextFleet(t, "hf:"+qwenDir, 16)
	for _, c := range file.Cases {
		p, aerr := api.Parse(c.Body, c.Path)
		if aerr != nil {
			t.Fatalf("%s: %v", c.Name, aerr.Message)
		}
		got := keysOf(fs, p, "conv-"+c.Name)[fsm.FleetContext]
		if got.Tokens != len(c.IDs) || !slices.Equal(got.Blocks, prefix.BlockHashes(c.IDs, 16)) {
			t.Errorf("%s: %d tokens, %d blocks; the reference %d tokens", c.Name, got.Tokens, len(got.Blocks), len(c.IDs))
		}
	}
	if len(file.Cases) < 6 {
		t.Fatalf("%d cases", len(file.Cases))
	}
}

// The committed fixture is what the JavaScript reference writes today
// (fails rather than skips without node when CI is set).
func TestDialectsFixtureReproduces(t *testing.T) {
	if testing.Short() {
		t.Skip("runs npm and node")
	}
	gen := filepath.Join("..", "..", "internal", "hftok", "testdata", "gen")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir, err := npmenv.Install(ctx, gen, "chat-golden", "package.json", "package-lock.json", "chat.mjs", "render.mjs", "dialects.mjs")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the JavaScript reference cannot run: %v", err)
		}
		t.Skipf("the JavaScript reference cannot run: %v", err)
	}
	cfg, err := filepath.Abs(filepath.Join("..", "..", "internal", "hftok", "testdata", "qwen3", "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "golden.json")
	cmd := exec.CommandContext(ctx, "node", "dialects.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "TETHER_QWEN3_CONFIG="+cfg, "TETHER_DIALECTS_GOLDEN="+out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("node dialects.mjs: %v\n%s", err, msg)
	}
	got, _ := os.ReadFile(out)
	want, err := os.ReadFile(filepath.Join("testdata", "qwen3_dialects_golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the reference now writes a different fixture: regenerate with node dialects.mjs in %s and review the diff", gen)
	}
}
