package edge

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/test/natstest"
)

// An edge that knows no leader serves on while it hears its workers (an
// election, or peers gone: the log never makes a soft request fail); once
// it also hears none of them (here its NATS peer cut off, the socket open:
// as far as it can tell it is partitioned from everything but its
// clients) it refuses every request bound for a worker with 503
// edge_isolated and Retry-After, in the path's API shape, instead of
// sending it to a worker it cannot reach; it serves again as soon as it
// hears a worker.
func TestIsolatedEdgeRefusesUntilItHearsAgain(t *testing.T) {
	ns := natstest.Start(t, nil)
	proxy := natstest.NewStallProxy(t, ns.Addr().String())
	startDisaggFleet(t, ns.ClientURL(), workerOpts{})
	ec := startEdges(t, 3, ns.ClientURL(), func(i int, c *Config) {
		if i == 0 {
			c.NATS.URLs = []string{"nats://" + proxy.Addr()}
		}
	})
	ec.waitInstances(4)
	te, c := ec.edge(0), httpClient(t)
	ec.kill(1)
	ec.kill(2)
	waitFor(t, "edge-1 knowing no leader", 20*time.Second, func() bool { id, _ := te.e.node.Leader(); return id == "" })
	chat := func(session string) response {
		return do(t, c, http.MethodPost, te.url()+"/v1/chat/completions",
			chatBody(t, longText("isolated", 20), []string{"hello " + session}, nil), map[string]string{"x-session-id": session})
	}
	if r := chat("leaderless-but-hearing"); r.status != http.StatusOK {
		t.Fatalf("no leader, the workers heard: %d %s", r.status, r.body)
	}

	proxy.Stall()
	waitFor(t, "/readyz naming the isolation", 20*time.Second, func() bool {
		r := do(t, c, http.MethodGet, te.url()+"/readyz", nil, nil)
		return r.status == http.StatusServiceUnavailable && strings.Contains(string(r.body), "isolated")
	})
	for _, q := range []struct {
		name, method, path, body string
		anthropic                bool
	}{
		{"chat", "POST", "/v1/chat/completions", string(chatBody(t, "", []string{"x"}, nil)), false},
		{"messages", "POST", "/v1/messages", `{"model":"` + testModel + `","max_tokens":4,"messages":[{"role":"user","content":"x"}]}`, true},
		{"a stored response by id", "GET", "/v1/responses/resp_t1AAAA", "", false},
		{"a conversation by id", "GET", "/v1/conversations/conv_t1AAAA", "", false},
	} {
		var body []byte
		if q.body != "" {
			body = []byte(q.body)
		}
		r := do(t, c, q.method, te.url()+q.path, body, nil)
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		err := json.Unmarshal(r.body, &e)
		switch {
		case r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "":
			t.Errorf("%s while isolated: %d (Retry-After %q) %s", q.name, r.status, r.header.Get("Retry-After"), r.body)
		case err != nil || !strings.Contains(e.Error.Message, "isolated"):
			t.Errorf("%s while isolated: not an error naming the isolation: %s", q.name, r.body)
		case q.anthropic && e.Type != "error":
			t.Errorf("%s while isolated: not Anthropic's error shape: %s", q.name, r.body)
		case !q.anthropic && (e.Type != "" || e.Error.Code != "edge_isolated"):
			t.Errorf("%s while isolated: not OpenAI's error shape with code edge_isolated: %s", q.name, r.body)
		}
	}
	if r := do(t, c, http.MethodGet, te.url()+"/v1/models", nil, nil); r.status != http.StatusOK {
		t.Errorf("the model list (the edge's own answer) while isolated: %d %s", r.status, r.body)
	}

	proxy.Resume()
	waitFor(t, "served again once a worker is heard", 20*time.Second, func() bool {
		return chat("heard-again").status == http.StatusOK
	})
}
