package edge

import (
	"net/http"
	"strings"
	"testing"
)

// Every 503 and 429 carries Retry-After, including no_healthy_instance.
func TestNoHealthyInstanceCarriesRetryAfter(t *testing.T) {
	_, te := startHealthSetup(t, workerOpts{}, func(c *Config) { c.ContextServers.HealthPath = "/not-served" })
	c := httpClient(t)
	r := do(t, c, http.MethodPost, te.url()+"/v1/chat/completions", oneTurn(t, "no-healthy"), map[string]string{"x-session-id": "no-healthy"})
	if r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "no_healthy_instance") {
		t.Fatalf("%d %s, want 503 no_healthy_instance", r.status, r.body)
	}
	if r.header.Get("Retry-After") == "" || r.header.Get("Retry-After-Ms") == "" {
		t.Errorf("503 no_healthy_instance without Retry-After: %v", r.header)
	}
}
