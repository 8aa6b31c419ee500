package apireq

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every captured request of the real CLIs (test/agentapi/testdata/clients:
// Claude Code's Messages requests with context_management, output_config.
// effort, thinking.display, metadata, defer_loading tools and inline
// system messages; Codex's Responses request with namespace and web_search
// tools, include, reasoning.summary, prompt_cache_key and client_metadata)
// parses, in either inline system mode, to a chat form with messages.
func TestClientRequestsParse(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "test", "agentapi", "testdata", "clients", "*", "*.json"))
	if err != nil || len(files) < 7 {
		t.Fatalf("client fixtures: %d (%v)", len(files), err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var cr struct {
			Path string          `json:"path"`
			Body json.RawMessage `json:"body"`
		}
		if err := json.Unmarshal(b, &cr); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		d := Messages
		if strings.HasPrefix(cr.Path, "/v1/responses") {
			d = Responses
		}
		r, aerr := Parse(d, cr.Body)
		if aerr != nil {
			t.Errorf("%s: %d %s (param %s)", f, aerr.Status, aerr.Message, aerr.Param)
			continue
		}
		for _, mode := range []InlineSystem{InlineSystemPreserve, InlineSystemFold} {
			if err := r.WithInlineSystem(mode); err != nil {
				t.Fatalf("%s %s: %v", f, mode, err)
			}
			var msgs []json.RawMessage
			if json.Unmarshal(r.Chat["messages"], &msgs) != nil || len(msgs) < 2 || len(r.WordTokens()) == 0 {
				t.Errorf("%s %s: chat form %d messages", f, mode, len(msgs))
			}
		}
		var tools []chatTool
		if json.Unmarshal(r.Chat["tools"], &tools) != nil || len(tools) == 0 {
			t.Errorf("%s: no chat tools", f)
		}
	}
}
