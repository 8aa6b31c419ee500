package apireq

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/tether-project/tether/internal/prefix"
)

// inlineSystemCases are conversations with the chat messages vLLM's
// Anthropic endpoint builds for them in each mode (testdata/
// inline_system.json says how they were derived).
type inlineSystemCases struct {
	Cases []struct {
		Name    string                     `json:"name"`
		Request json.RawMessage            `json:"request"`
		Want    map[string]json.RawMessage `json:"want"`
	} `json:"cases"`
}

// chatFormOf is r's chat messages as generic JSON, an assistant turn's
// null content left out (vLLM writes no content key there; a template
// reads both as none).
func chatFormOf(t *testing.T, r *Request) any {
	t.Helper()
	var msgs []map[string]any
	if err := json.Unmarshal(r.Chat["messages"], &msgs); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if c, ok := m["content"]; ok && c == nil {
			delete(m, "content")
		}
	}
	var out any
	b, _ := json.Marshal(msgs)
	_ = json.Unmarshal(b, &out)
	return out
}

func TestInlineSystemMatchesVLLM(t *testing.T) {
	b, err := os.ReadFile("testdata/inline_system.json")
	if err != nil {
		t.Fatal(err)
	}
	var cs inlineSystemCases
	if err := json.Unmarshal(b, &cs); err != nil {
		t.Fatal(err)
	}
	if len(cs.Cases) < 10 {
		t.Fatalf("%d cases", len(cs.Cases))
	}
	for _, c := range cs.Cases {
		for _, mode := range []InlineSystem{InlineSystemPreserve, InlineSystemFold} {
			t.Run(fmt.Sprintf("%s/%s", c.Name, mode), func(t *testing.T) {
				r := mustParse(t, Messages, string(c.Request))
				if err := r.WithInlineSystem(mode); err != nil {
					t.Fatal(err)
				}
				var want any
				if err := json.Unmarshal(c.Want[mode.String()], &want); err != nil {
					t.Fatal(err)
				}
				if got := chatFormOf(t, r); !reflect.DeepEqual(got, want) {
					g, _ := json.Marshal(got)
					t.Fatalf("chat messages\n got %s\nwant %s", g, c.Want[mode.String()])
				}
			})
		}
	}
}

// Each turn of a Claude Code session renders as an extension of the turn
// before, in either mode: its block keys are the previous turn's and more.
func TestClaudeCodeTurnsExtendEachOther(t *testing.T) {
	var turns [][]byte
	for _, f := range []string{"0002", "0003", "0004"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "test", "agentapi", "testdata", "clients", "claude-code-2.1.328", f+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var cr struct {
			Body json.RawMessage `json:"body"`
		}
		if err := json.Unmarshal(b, &cr); err != nil {
			t.Fatal(err)
		}
		turns = append(turns, cr.Body)
	}
	// The next turn as Claude Code sends it: the answer, then a new system
	// message (as its deferred-tools notice, capture 0008) and the user's.
	var next map[string]json.RawMessage
	if err := json.Unmarshal(turns[len(turns)-1], &next); err != nil {
		t.Fatal(err)
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(next["messages"], &msgs); err != nil {
		t.Fatal(err)
	}
	msgs = append(msgs, json.RawMessage(`{"role":"assistant","content":[{"type":"text","text":"Resuming: notes.txt does not exist."}]}`),
		json.RawMessage(`{"role":"system","content":[{"type":"text","text":"The following deferred tools are now available via ToolSearch: WebFetch, WebSearch","cache_control":{"type":"ephemeral"}}]}`),
		json.RawMessage(`{"role":"user","content":[{"type":"text","text":"create it"}]}`))
	next["messages"] = marshal(msgs)
	turns = append(turns, marshal(next))
	for _, mode := range []InlineSystem{InlineSystemPreserve, InlineSystemFold} {
		var prev []uint32
		for i, body := range turns {
			r := mustParse(t, Messages, string(body))
			if err := r.WithInlineSystem(mode); err != nil {
				t.Fatal(err)
			}
			toks := r.WordTokens()
			if i > 0 {
				if len(toks) <= len(prev) || !reflect.DeepEqual(toks[:len(prev)], prev) {
					t.Fatalf("%s: turn %d does not extend turn %d", mode, i, i-1)
				}
				pb, nb := prefix.BlockHashes(prev, 16), prefix.BlockHashes(toks, 16)
				if len(pb) == 0 || !reflect.DeepEqual(nb[:len(pb)], pb) {
					t.Fatalf("%s: turn %d's block keys do not start with turn %d's", mode, i, i-1)
				}
			}
			prev = toks
		}
	}
}
