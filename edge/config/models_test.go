package config

import (
	"strings"
	"testing"
)

// A models entry is checked like the top-level fleets, its errors named
// under models[i]; names are unique across models and adapters; instances
// serve one model.
func TestModelsConfigValidation(t *testing.T) {
	base := `
model: m1
context_servers: {urls: ["http://127.0.0.1:9001"]}
generation_servers: {urls: ["http://127.0.0.1:9002"]}
internal_request_auth_key: k0123456789abcdef
cluster: {node_id: e1, data_dir: /tmp/x, bootstrap: true, peers: [{id: e1, addr: "127.0.0.1:7000"}]}
lora: {adapters: [a1, {name: a2, path: /p/a2}], max_loras: 2}
`
	cfg, err := ParseConfig([]byte(base + `
models:
  - name: m2
    context_servers: {urls: ["http://127.0.0.1:9003"]}
    generation_servers: {urls: ["http://127.0.0.1:9004"]}
    lora: {adapters: [b1]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Models) != 1 || cfg.Models[0].ContextServers.HealthPath != DefaultHealthPath || cfg.Models[0].ContextServers.Tokenizer != TokenizerWords ||
		cfg.LoRA.Adapters[0].Name != "a1" || cfg.LoRA.Adapters[1].Path != "/p/a2" || cfg.LoRA.MaxLoRAs != 2 {
		t.Fatalf("parsed %+v %+v", cfg.Models, cfg.LoRA)
	}
	for _, c := range []struct{ yaml, want string }{
		{"models:\n  - context_servers: {urls: [\"http://127.0.0.1:9003\"]}\n    generation_servers: {urls: [\"http://127.0.0.1:9004\"]}\n", "models[0].name, line 9: required"},
		{"models:\n  - name: m1\n    context_servers: {urls: [\"http://127.0.0.1:9003\"]}\n    generation_servers: {urls: [\"http://127.0.0.1:9004\"]}\n", `models[0].name, line 9: "m1" is also model`},
		{"models:\n  - name: a1\n    context_servers: {urls: [\"http://127.0.0.1:9003\"]}\n    generation_servers: {urls: [\"http://127.0.0.1:9004\"]}\n", `"a1" is also`},
		{"models:\n  - name: m2\n    context_servers: {urls: [\"http://127.0.0.1:9001\"]}\n    generation_servers: {urls: [\"http://127.0.0.1:9004\"]}\n", "models[0].context_servers.urls[0], line 10: duplicate URL"},
		{"models:\n  - name: m2\n    context_servers: {urls: [\"ftp://x\"]}\n    generation_servers: {urls: [\"http://127.0.0.1:9004\"]}\n", "models[0].context_servers.urls[0], line 10:"},
		{"models:\n  - name: m2\n    context_servers: {urls: [\"http://127.0.0.1:9003\"], engine: nope}\n    generation_servers: {urls: [\"http://127.0.0.1:9004\"]}\n", "models[0].context_servers.engine, line 10: unknown engine"},
		{"models:\n  - name: m2\n    context_servers: {urls: [\"http://127.0.0.1:9003\"]}\n    generation_servers: {urls: [\"http://127.0.0.1:9004\"]}\n    lora: {runtime_load: true}\n", "models[0].lora.runtime_load, line 12: only vLLM"},
		{"models:\n  - name: m2\n    context_servers: {urls: [\"http://127.0.0.1:9003\"]}\n    generation_servers: {urls: [\"http://127.0.0.1:9004\"]}\n    colour: red\n", "models[0].colour"},
		{"model_aliases: [m1-alias, a1]\n", `lora.adapters[0].name, line 7: "a1" is also model_aliases[1]`},
		{"model_aliases: [\"\"]\n", `model_aliases[0], line 8: "" must be 1..256 bytes`},
		{"models:\n  - name: m2\n    aliases: [m1]\n    context_servers: {urls: [\"http://127.0.0.1:9003\"]}\n    generation_servers: {urls: [\"http://127.0.0.1:9004\"]}\n", `models[0].aliases[0], line 10: "m1" is also model`},
	} {
		_, err := ParseConfig([]byte(base + c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want an error containing %q", c.yaml, err, c.want)
		}
	}
}
