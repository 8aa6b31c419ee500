package catalog

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/tokenize"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
)

// Each model's tokenizer is its own: a second model whose fleets run a
// SentencePiece-style tokenizer (Mistral's, internal/hftok) gets its block
// keys from it, the first model from the words tokenizer.
func TestModelsHaveTheirOwnTokenizers(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.Model = "words-model"
	d := config.DefaultConfig()
	m := config.ModelConfig{Name: "mistral-model", ContextServers: d.ContextServers, GenerationServers: d.GenerationServers}
	m.ContextServers.Tokenizer, m.ContextServers.BlockSize = "hf:../../internal/hftok/testdata/mistral", 16
	m.GenerationServers.Tokenizer, m.GenerationServers.BlockSize = m.ContextServers.Tokenizer, 16
	cfg.Models = []config.ModelConfig{m}
	cfg.Normalize()
	cat, err := New(&cfg, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The context fleet's prompt tokens of a completions request to the
	// model it names.
	tokens := func(body string) (int, int) {
		p, aerr := apireq.Parse(apireq.Completions, []byte(body))
		if aerr != nil {
			t.Fatal(aerr.Message)
		}
		m, _, _ := cat.Lookup(p.Model)
		prompts := m.Tokenizers.Keys(tokenize.Request{Parsed: p, Words: p.WordTokens()}, m.Cfg.Aggregated(), slog.New(slog.DiscardHandler))
		return prompts[fsm.FleetContext].Tokens, len(p.WordTokens())
	}
	// The Metaspace golden of internal/hftok for this prompt.
	if got, words := tokens(`{"model":"mistral-model","prompt":"Hello, my dog is cute"}`); got != 6 || words != 5 {
		t.Fatalf("mistral model: %d tokens (words %d), want Mistral's 6", got, words)
	}
	if got, _ := tokens(`{"model":"words-model","prompt":"Hello, my dog is cute"}`); got != 5 {
		t.Fatalf("words model: %d tokens, want 5", got)
	}
}

// With several models an alias routes to its own model's fleets and keys.
func TestAliasOfASecondModelIsThatModel(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.Model = "first"
	d := config.DefaultConfig()
	cfg.Models = []config.ModelConfig{{Name: "second", Aliases: []string{"second-alias"}, ContextServers: d.ContextServers, GenerationServers: d.GenerationServers}}
	cfg.Normalize()
	cat, err := New(&cfg, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, adapter, ok := cat.Lookup("second-alias")
	if !ok || adapter != "" || m.Name != "second" || m.Key("k") != fsm.ModelKey("second", "k") {
		t.Fatalf("second-alias resolves to %+v %q %v", m, adapter, ok)
	}
	if !strings.Contains(cat.NotFound("nope").Message, `"second-alias" (a name of second)`) {
		t.Fatalf("404 does not list the alias: %s", cat.NotFound("nope").Message)
	}
}
