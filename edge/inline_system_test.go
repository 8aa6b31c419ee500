package edge

import (
	"testing"

	"github.com/tether-project/tether/edge/catalog"
	"github.com/tether-project/tether/internal/apireq"
)

// A model's anthropic_inline_system places a Messages request's inline
// system messages in the prompt the edge keys: fold merges them into the
// user turn as an engine folding them renders it; preserve (the default)
// keeps them in place.
func TestAnthropicInlineSystemSetting(t *testing.T) {
	body := `{"model":"m","max_tokens":8,"system":"sys","messages":[{"role":"user","content":"q1"},{"role":"system","content":"reminder"}]}`
	want := func(mode apireq.InlineSystem) []uint32 {
		p, aerr := apireq.Parse(apireq.Messages, []byte(body))
		if aerr != nil {
			t.Fatal(aerr)
		}
		if aerr := p.WithInlineSystem(mode); aerr != nil {
			t.Fatal(aerr)
		}
		return p.WordTokens()
	}
	for _, setting := range []string{"", "preserve", "fold"} {
		rq, _, tokens, aerr := parseBody([]byte(body), apireq.Messages)
		if aerr != nil {
			t.Fatal(aerr)
		}
		rq.Model = &catalog.Model{Cfg: &Config{AnthropicInlineSystem: setting}}
		got, aerr := placeInlineSystem(rq, tokens)
		if aerr != nil {
			t.Fatal(aerr)
		}
		mode, _ := apireq.ParseInlineSystem(setting)
		if w := want(mode); len(got) != len(w) {
			t.Fatalf("%q: %d tokens, want %d", setting, len(got), len(w))
		}
	}
	if a, b := want(apireq.InlineSystemPreserve), want(apireq.InlineSystemFold); len(a) == len(b) {
		t.Fatalf("the modes key alike (%d tokens): the test shows nothing", len(a))
	}
}
