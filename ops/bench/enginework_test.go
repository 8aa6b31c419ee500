package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// vLLM's exposition as prometheus_client writes it: the counter's HELP and
// TYPE under its _total name, one series per engine core and source.
const vllmExposition = `# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 1000.0
vllm:prompt_tokens_by_source_total{engine="1",model_name="m",source="local_compute"} 500.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 200.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 40.0
`

func TestScrapeEngineWork(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(vllmExposition))
	}))
	defer srv.Close()
	w, err := ScrapeEngineWork(context.Background(), srv.Client(), []string{srv.URL, srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if w.Computed != 3000 || w.CacheHit != 400 || w.Transferred != 80 || w.Engines != 2 {
		t.Fatalf("%+v", w)
	}
	run := &RunResult{Records: []RequestRecord{{Prompt: 100}, {Prompt: 300}}}
	d := w.Since(EngineWork{Computed: 1000, Engines: 2}, run)
	if d.Computed != 2000 || d.Requests != 2 || d.PromptTokens != 400 {
		t.Fatalf("%+v", d)
	}
	var sb strings.Builder
	if err := d.WriteText(&sb); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, line := range strings.Split(sb.String(), "\n") {
		if f := strings.Fields(line); len(f) == 6 && f[0] == "computed" && f[3] == "2000" && f[4] == "1000" && f[5] == "5.00" {
			found = true
		}
	}
	if !found {
		t.Fatalf("no computed row of 2000 tokens, 1000 per request, 5.00 per prompt token:\n%s", sb.String())
	}
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("up 1\n")) }))
	defer bad.Close()
	if _, err := ScrapeEngineWork(context.Background(), bad.Client(), []string{bad.URL}); err == nil || !strings.Contains(err.Error(), "vllm:prompt_tokens_by_source_total") {
		t.Fatalf("a /metrics without the counter: %v", err)
	}
}
