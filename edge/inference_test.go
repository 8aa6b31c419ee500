package edge

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/natstest"
)

// max_tokens 1: the context phase already produced the whole answer, so
// the edge returns it without a generation hop, as JSON or as SSE.
func TestContextPhaseFinalAnswer(t *testing.T) {
	s := startStatic(t, 1, 1, nil)
	body := chatBody(t, longText("final", 24), []string{"go"}, map[string]any{"max_tokens": 1})
	r := s.chat(t, body, map[string]string{"x-session-id": "final-conv"})
	if r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	m := r.json(t)
	if _, leaked := m["disaggregated_params"]; leaked || m["object"] != "chat.completion" {
		t.Fatalf("response %s", r.body)
	}
	if ci, gi := routeOf(t, r); ci != "ctx-0" || gi != "" {
		t.Fatalf("route %q", r.header.Get(HeaderRoute))
	}
	if r.header.Get(HeaderADPRank) == "" {
		t.Fatal("no ADP rank relayed")
	}
	if len(s.gen[0].requests()) != 0 {
		t.Fatal("a generation hop happened")
	}
	body = chatBody(t, longText("final", 24), []string{"go"}, map[string]any{"max_tokens": 1, "stream": true,
		"stream_options": map[string]any{"include_usage": true}})
	r = s.chat(t, body, map[string]string{"x-session-id": "final-conv"})
	if r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %d %s %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	events := sse(t, r.body)
	if len(events) != 4 || events[3] != "[DONE]" {
		t.Fatalf("events %q", events)
	}
	var usage struct {
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(events[2]), &usage); err != nil || usage.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatalf("usage chunk %s (%v)", events[2], err)
	}
}

// sse splits an SSE body into its data payloads.
func sse(t testing.TB, body []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// Streaming through the disaggregated flow: the generation worker's SSE
// chunks pass through, ending in [DONE]; the usage chunk reports the
// context phase's cached tokens.
func TestStreamingPassthrough(t *testing.T) {
	s := startStatic(t, 1, 1, nil)
	a := &agent{session: "stream-conv", system: longText("stream", 24)}
	first := a.send(t, s.c, s.te, "one", nil)
	a.turns = append(a.turns, "two")
	body := chatBody(t, a.system, a.turns, map[string]any{"stream": true, "max_tokens": 5, "stream_options": map[string]any{"include_usage": true}})
	r := s.chat(t, body, map[string]string{"x-session-id": "stream-conv"})
	if r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	events := sse(t, r.body)
	if len(events) < 3 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("events %q", events)
	}
	var text strings.Builder
	cached := -1
	for _, ev := range events[:len(events)-1] {
		var c struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil || c.Object != "chat.completion.chunk" {
			t.Fatalf("chunk %s: %v", ev, err)
		}
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
		}
		if c.Usage != nil {
			cached = c.Usage.PromptTokensDetails.CachedTokens
		}
	}
	if len(strings.Fields(text.String())) != 5 {
		t.Fatalf("streamed text %q", text.String())
	}
	if want := first.prompt / testBlockSize * testBlockSize; cached < want {
		t.Fatalf("streamed usage cached_tokens %d, want >= %d", cached, want)
	}
}

// A worker's scheduler evicting a conversation (LRU beyond max_sessions)
// makes the leader evict the binding, conditional on its epoch.
func TestKVEvictedConversationsAreEvicted(t *testing.T) {
	ns := natstest.Start(t, nil)
	startWorker(t, "ctx-0", workerOpts{fleet: telemetry.FleetContext, role: hintauth.RoleContext, nats: ns.ClientURL(), maxSessions: 1})
	startWorker(t, "gen-0", workerOpts{fleet: telemetry.FleetGeneration, role: hintauth.RoleGeneration, nats: ns.ClientURL()})
	ec := startEdges(t, 1, ns.ClientURL(), nil)
	ec.waitInstances(2)
	te, c := ec.edge(0), httpClient(t)
	(&agent{session: "lru-old", system: longText("lru-a", 24)}).send(t, c, te, "one", nil)
	// Dispatched beside its Bind: the eviction below is of a binding, so
	// the Bind must have committed first.
	waitFor(t, "the first conversation's binding", 10*time.Second, func() bool {
		_, ok := te.e.Node().State().Lookup(fsm.FleetContext, "lru-old")
		return ok
	})
	(&agent{session: "lru-new", system: longText("lru-b", 24)}).send(t, c, te, "one", nil)
	waitFor(t, "the evicted conversation's binding gone", 10*time.Second, func() bool {
		_, ok := te.e.Node().State().Lookup(fsm.FleetContext, "lru-old")
		return !ok
	})
	if n := te.e.Node().State().Counters().Evictions[fsm.EvictKVEvicted]; n < 1 {
		t.Fatalf("kv_evicted evictions %d", n)
	}
	if _, ok := te.e.Node().State().Lookup(fsm.FleetContext, "lru-new"); !ok {
		t.Fatal("the live conversation was evicted too")
	}
}

// nats.embedded: the edge runs the NATS server its workers report to.
func TestEmbeddedNATS(t *testing.T) {
	ec := startEdges(t, 1, "", func(_ int, c *Config) {
		c.NATS = NATSConfig{Embedded: true, Listen: "127.0.0.1:0"}
	})
	te := ec.edge(0)
	url := te.e.NATSURL()
	if url == "" {
		t.Fatal("no embedded NATS URL")
	}
	startWorker(t, "ctx-0", workerOpts{fleet: telemetry.FleetContext, role: hintauth.RoleContext, nats: url})
	startWorker(t, "gen-0", workerOpts{fleet: telemetry.FleetGeneration, role: hintauth.RoleGeneration, nats: url})
	ec.waitInstances(2)
	c := httpClient(t)
	waitFor(t, "/readyz", 10*time.Second, func() bool {
		return do(t, c, http.MethodGet, te.url()+"/readyz", nil, nil).status == http.StatusOK
	})
	(&agent{session: "embedded", system: longText("emb", 24)}).send(t, c, te, "hi", nil)
}
