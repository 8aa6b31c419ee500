package edge

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/test/engines/oaiserve"
	"github.com/tether-project/tether/test/engines/vllm"
	"github.com/tether-project/tether/test/repo"
)

// The configuration of several models with LoRA adapters that README.md
// and docs/engines.md show starts and serves: vLLM stand-ins at its servers' addresses (review-agent
// not among the stand-in's --lora-modules, so the edge loads it at
// runtime), internal/hftok's Mistral and Qwen3 fixtures at its tokenizer
// directories, the test cluster's section for its own. Every model and
// adapter is listed and answered by its model's servers.
func TestModelsDocExampleStarts(t *testing.T) {
	for _, env := range []string{EnvInternalRequestAuthKey, EnvAdminToken, EnvClusterAuthKey} {
		t.Setenv(env, "")
	}
	for _, file := range []string{"../README.md", "../docs/engines.md"} {
		doc, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var text string
		for _, b := range repo.YAMLBlocks(string(doc)) {
			if strings.Contains(b.Text, "\nmodels:") && strings.Contains(b.Text, "lora:") {
				text = b.Text
			}
		}
		if text == "" {
			t.Fatalf("%s has no configuration with models and lora", file)
		}
		t.Run(file, func(t *testing.T) { startModelsExample(t, text) })
	}
}

func startModelsExample(t *testing.T, text string) {
	mistral := func() *oaiserve.Server {
		s := vllm.Start(vllm.Options{Model: "mistral-7b-instruct", PromptTokensDetails: true, MaxLoRAs: 2, RuntimeLoRA: true,
			LoRAModules: []string{"sql-agent=/adapters/mistral-sql-agent"}})
		t.Cleanup(s.Close)
		return s
	}
	m0, m1 := mistral(), mistral()
	q0 := vllm.Start(vllm.Options{Model: "qwen3-8b", PromptTokensDetails: true, LoRAModules: []string{"triage-agent"}})
	t.Cleanup(q0.Close)
	for from, to := range map[string]string{
		"http://10.0.4.1:8000": m0.URL(), "http://10.0.4.2:8000": m1.URL(), "http://10.0.5.1:8000": q0.URL(),
		"hf:/models/mistral-7b-instruct": "hf:../internal/hftok/testdata/mistral", "hf:/models/qwen3-8b": "hf:../internal/hftok/testdata/qwen3",
	} {
		if !strings.Contains(text, from) {
			t.Fatalf("the example no longer names %s", from)
		}
		text = strings.ReplaceAll(text, from, to)
	}
	doc2, err := ParseConfig([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	ec := startEdges(t, 1, "", func(_ int, c *Config) {
		c.Model, c.ContextServers, c.GenerationServers, c.LoRA, c.Models = doc2.Model, doc2.ContextServers, doc2.GenerationServers, doc2.LoRA, doc2.Models
		c.ParentHeader, c.Placement.BlockSize = doc2.ParentHeader, doc2.Placement.BlockSize
		c.Telemetry.ProbeInterval = 100 * time.Millisecond
	})
	ec.waitInstances(3)
	te := ec.edge(0)
	cl := httpClient(t)
	r := do(t, cl, http.MethodGet, te.url()+"/v1/models", nil, nil)
	for _, id := range []string{"mistral-7b-instruct", "sql-agent", "review-agent", "qwen3-8b", "triage-agent"} {
		if !strings.Contains(string(r.body), `"id":"`+id+`"`) {
			t.Fatalf("GET /v1/models lacks %s: %s", id, r.body)
		}
	}
	for _, x := range []struct {
		model   string
		servers []*oaiserve.Server
	}{{"mistral-7b-instruct", []*oaiserve.Server{m0, m1}}, {"sql-agent", []*oaiserve.Server{m0, m1}},
		{"review-agent", []*oaiserve.Server{m0, m1}}, {"qwen3-8b", []*oaiserve.Server{q0}}, {"triage-agent", []*oaiserve.Server{q0}}} {
		msg := "hello from a " + x.model + " conversation"
		body := chatBody(t, longText("sys-"+x.model, 40), []string{msg}, map[string]any{"model": x.model})
		r := postChat(t, cl, te.url(), body, map[string]string{"x-session-id": "conv-" + x.model})
		var out struct {
			Model string `json:"model"`
		}
		if r.status != http.StatusOK || json.Unmarshal(r.body, &out) != nil || out.Model != x.model {
			t.Fatalf("%s: %d %s", x.model, r.status, r.body)
		}
		served := false
		for _, s := range x.servers {
			for _, sv := range s.Served() {
				served = served || sv.LastUser == msg
			}
		}
		if !served {
			t.Fatalf("%s was not served by its model's servers", x.model)
		}
	}
}
