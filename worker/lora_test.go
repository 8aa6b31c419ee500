package worker

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/tether-project/tether/test/workertest"
)

// A worker with adapters serves each as a model (404 for any other), lists
// them with their parent on /v1/models, reports its slots and each rank's
// adapters, and keeps a new conversation of an adapter on the rank that
// holds it.
func TestWorkerServesLoRAAdapters(t *testing.T) {
	cfg := testConfig("lora-1")
	cfg.LoRA = LoRAConfig{Adapters: []string{"agent-a", "agent-b"}, MaxLoRAs: 1}
	s := workertest.Start(t, New, cfg)
	c := testClient(t)
	base := "http://" + s.Addr().String()
	models := do(t, c, http.MethodGet, base+"/v1/models", "", nil)
	if !strings.Contains(string(models.body), `"id":"agent-a"`) || !strings.Contains(string(models.body), `"parent":"test-model"`) {
		t.Fatalf("/v1/models: %s", models.body)
	}
	if r := do(t, c, http.MethodGet, base+"/v1/models/agent-b", "", nil); r.status != http.StatusOK {
		t.Fatalf("/v1/models/agent-b: %d %s", r.status, r.body)
	}
	chat := func(model, conv string) response {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":"hello from %s one two three four five six"}]}`, model, conv)
		return post(t, c, base+"/v1/chat/completions", body, map[string]string{"x-session-id": conv})
	}
	if r := chat("agent-z", "z"); r.status != http.StatusNotFound || !strings.Contains(string(r.body), "model_not_found") {
		t.Fatalf("unknown adapter: %d %s", r.status, r.body)
	}
	var ranks []string
	for i := range 4 {
		r := chat("agent-a", fmt.Sprintf("conv-%d", i))
		if r.status != http.StatusOK || r.json(t)["model"] != "agent-a" {
			t.Fatalf("agent-a: %d %s", r.status, r.body)
		}
		ranks = append(ranks, r.header.Get(HeaderADPRank))
	}
	if len(slices.Compact(slices.Clone(ranks))) != 1 {
		t.Fatalf("new agent-a conversations on ranks %v: want the rank holding it", ranks)
	}
	held := 0
	for _, rk := range s.rankLoads() { // what the load report carries
		if slices.Contains(rk.LoRAAdapters, "agent-a") {
			held++
		}
	}
	if s.reportedMaxLoRAs() != 1 || held != 1 {
		t.Fatalf("load report: max_loras %d, agent-a on %d ranks: %+v", s.reportedMaxLoRAs(), held, s.rankLoads())
	}
}

func TestWorkerLoRAConfigErrors(t *testing.T) {
	for _, c := range []struct {
		lora LoRAConfig
		want string
	}{
		{LoRAConfig{Adapters: []string{"test-model"}}, "lora.adapters[0]"},
		{LoRAConfig{Adapters: []string{"a", "a"}}, "lora.adapters[1]"},
		{LoRAConfig{Adapters: []string{"a,b"}}, "lora.adapters[0]"},
		{LoRAConfig{MaxLoRAs: -1}, "lora.max_loras"},
	} {
		cfg := testConfig("w")
		cfg.LoRA = c.lora
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.lora, err, c.want)
		}
	}
}
