package devstack

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing"
)

// aggReply is one answer of an aggregated stack: the instance and rank
// its one hop went to, the generation hop ("" when there was none) and the
// body.
type aggReply struct {
	inst, rank, gen string
	body            []byte
}

// aggPost posts body to path through n (the session header when given)
// and reads the route of its answer, which must be 200.
func aggPost(t *testing.T, c *http.Client, n *EdgeNode, path, session string, body any) aggReply {
	t.Helper()
	b, _ := json.Marshal(body)
	req, err := http.NewRequest(http.MethodPost, n.URL()+path, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if session != "" {
		req.Header.Set("x-session-id", session)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s via %s: %v", path, n.ID, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s via %s: %d %s", path, n.ID, resp.StatusCode, out)
	}
	r, err := edge.ParseRoute(resp.Header.Get(edge.HeaderRoute))
	if err != nil {
		t.Fatal(err)
	}
	return aggReply{inst: r.ContextInstance, rank: r.ContextRank, gen: r.GenerationInstance, body: out}
}

// aggregatedConversation sends a conversation's turns through each edge in
// turn, the prompt growing by the answers: every turn is one hop to the
// same instance and rank of the aggregated fleet, every turn after the
// first finds the turns before it cached, and every edge's log binds the
// conversation to that instance.
func aggregatedConversation(t *testing.T, c *http.Client, st *Stack) string {
	t.Helper()
	msgs := []map[string]string{{"role": "system", "content": strings.Repeat("you are a careful coding agent; ", 40)}}
	var inst, rank string
	for turn := range 4 {
		n := st.Edges()[turn%len(st.Edges())]
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("step %d: %s", turn, strings.Repeat("more detail ", 20))})
		r := aggPost(t, c, n, "/v1/chat/completions", "agg-conv", map[string]any{"model": st.Model(), "max_tokens": 6, "messages": msgs})
		var out struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
			Usage struct {
				Prompt  int `json:"prompt_tokens"`
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(r.body, &out); err != nil || len(out.Choices) != 1 {
			t.Fatalf("turn %d: %v %s", turn, err, r.body)
		}
		if r.inst == "" || r.gen != "" {
			t.Fatalf("turn %d via %s: route context %q generation %q, want one hop to the aggregated fleet", turn, n.ID, r.inst, r.gen)
		}
		if turn == 0 {
			inst, rank = r.inst, r.rank
		} else if r.inst != inst || r.rank != rank {
			t.Fatalf("turn %d via %s on %s/%s; the conversation is on %s/%s", turn, n.ID, r.inst, r.rank, inst, rank)
		}
		// The turns before fill whole 64-token blocks of this prompt.
		if cached := out.Usage.Details.Cached; turn > 0 && (cached < 256 || cached >= out.Usage.Prompt) {
			t.Fatalf("turn %d via %s: cached_tokens %d of %d, want the turns before", turn, n.ID, cached, out.Usage.Prompt)
		}
		msgs = append(msgs, map[string]string{"role": "assistant", "content": out.Choices[0].Message.Content})
	}
	for _, n := range st.Edges() {
		if b, ok := binding(t, n, fsm.FleetContext, "agg-conv"); !ok || b.Instance != inst {
			t.Fatalf("%s: binding %+v (found %v), want %s", n.ID, b, ok, inst)
		}
	}
	return inst
}

// aggregatedAgentAPIs serves the Messages API (a session's two turns, the
// second streamed and cached) and a chain of stored Responses responses,
// each continued through another edge and read back through a third, on
// the aggregated fleet: one hop each, continuations on the instance that
// holds the response.
func aggregatedAgentAPIs(t *testing.T, c *http.Client, st *Stack) {
	t.Helper()
	e := st.Edges()
	model := st.Model()
	system := strings.Repeat("you review patches; ", 60)
	msgs := []any{map[string]any{"role": "user", "content": "review the first patch"}}
	first := aggPost(t, c, e[0], "/v1/messages", "agg-cc", map[string]any{"model": model, "max_tokens": 8, "system": system, "messages": msgs})
	var m struct {
		Type    string `json:"type"`
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	if err := json.Unmarshal(first.body, &m); err != nil || m.Type != "message" || len(m.Content) == 0 || first.gen != "" {
		t.Fatalf("messages: %v generation %q %s", err, first.gen, first.body)
	}
	msgs = append(msgs, map[string]any{"role": "assistant", "content": m.Content[0].Text}, map[string]any{"role": "user", "content": "and the second"})
	second := aggPost(t, c, e[1], "/v1/messages", "agg-cc", map[string]any{"model": model, "max_tokens": 8, "system": system, "messages": msgs, "stream": true})
	if second.inst != first.inst || second.gen != "" || !bytes.Contains(second.body, []byte("event: message_stop")) {
		t.Fatalf("streamed messages on %s (first on %s), generation %q: %s", second.inst, first.inst, second.gen, second.body)
	}
	if !bytes.Contains(second.body, []byte(`"cache_read_input_tokens":`)) || bytes.Contains(second.body, []byte(`"cache_read_input_tokens":0`)) {
		t.Fatalf("the second turn read nothing from the cache: %s", second.body)
	}

	type respObj struct {
		ID       string `json:"id"`
		Previous string `json:"previous_response_id"`
		Status   string `json:"status"`
		Usage    struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"input_tokens_details"`
		} `json:"usage"`
	}
	r := aggPost(t, c, e[0], "/v1/responses", "", map[string]any{"model": model, "input": "plan " + strings.Repeat("the release ", 40), "max_output_tokens": 8})
	var prev respObj
	if err := json.Unmarshal(r.body, &prev); err != nil || prev.ID == "" || r.gen != "" {
		t.Fatalf("responses: %v generation %q %s", err, r.gen, r.body)
	}
	holder := r.inst
	for i := range 3 {
		n := e[(i+1)%len(e)]
		next := aggPost(t, c, n, "/v1/responses", "", map[string]any{"model": model, "input": fmt.Sprintf("step %d", i),
			"previous_response_id": prev.ID, "max_output_tokens": 8, "stream": i == 1})
		if next.inst != holder || next.gen != "" {
			t.Fatalf("continuation %d via %s on %s (generation %q); the chain is on %s", i, n.ID, next.inst, next.gen, holder)
		}
		body := next.body
		if i == 1 {
			body = lastResponse(t, body)
		}
		var o respObj
		// (max_output_tokens ends the answers: status incomplete.)
		if err := json.Unmarshal(body, &o); err != nil || o.ID == "" || o.Previous != prev.ID || o.Status == "failed" {
			t.Fatalf("continuation %d: %v %s (previous %s)", i, err, body, prev.ID)
		}
		if o.Usage.Details.Cached == 0 {
			t.Fatalf("continuation %d found nothing of the chain cached: %s", i, body)
		}
		if status, got := getResponse(t, c, e[(i+2)%len(e)], o.ID); status != http.StatusOK || !strings.Contains(got, `"id":"`+o.ID+`"`) {
			t.Fatalf("GET %s via %s: %d %s", o.ID, e[(i+2)%len(e)].ID, status, got)
		}
		prev = o
	}
}

// lastResponse is the response object of a Responses stream's final event
// (response.completed, or response.incomplete at max_output_tokens).
func lastResponse(t *testing.T, stream []byte) []byte {
	t.Helper()
	var last []byte
	for _, line := range strings.Split(string(stream), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type     string          `json:"type"`
			Response json.RawMessage `json:"response"`
		}
		if json.Unmarshal([]byte(data), &ev) == nil && (ev.Type == "response.completed" || ev.Type == "response.incomplete") {
			last = ev.Response
		}
	}
	if last == nil {
		t.Fatalf("no final response event in the stream: %s", stream)
	}
	return last
}

// tether dev --generation-workers 0: one fleet of simulated workers serves
// whole requests through three edges — a conversation on one instance and
// rank with its earlier turns cached, the Messages API, and a chain of
// stored responses continued through every edge — natively and through
// proxy workers in front of simulated engines publishing vLLM KV events.
func TestAggregatedStack(t *testing.T) {
	for _, mode := range []string{"", EngineEventsVLLM} {
		t.Run("engine-events="+mode, func(t *testing.T) {
			if mode != "" && testing.Short() {
				t.Skip("a second stack")
			}
			st := startStack(t, Options{Aggregated: true, Ranks: 2, EngineEvents: mode})
			if got := len(st.Workers()); got != DefaultContextWorkers {
				t.Fatalf("%d workers, want %d", got, DefaultContextWorkers)
			}
			for _, w := range st.Workers() {
				if w.Fleet != fsm.FleetContext || !strings.HasPrefix(w.ID, "ctx-") {
					t.Fatalf("worker %s of fleet %s in an aggregated stack", w.ID, w.Fleet)
				}
			}
			if cfg := st.EdgeConfig(0); !cfg.Aggregated() {
				t.Fatal("the edges' configuration is not aggregated")
			}
			c := stackClient(t, st)
			aggregatedConversation(t, c, st)
			aggregatedAgentAPIs(t, c, st)
		})
	}
}

// An aggregated stack has no generation fleet: asking for one, or for
// sub-agents following their parent on it, is refused by name.
func TestAggregatedOptionErrors(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Aggregated: true, GenerationWorkers: 2}, "generation workers: an aggregated stack has none"},
		{Options{Aggregated: true, Scope: routing.ScopeBoth}, "scope: both"},
	} {
		err := c.o.Normalize()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%+v: %v, want an error mentioning %q", c.o, err, c.want)
		}
	}
	o := Options{Aggregated: true}
	if err := o.Normalize(); err != nil || o.GenerationWorkers != 0 || o.ContextWorkers != DefaultContextWorkers {
		t.Fatalf("aggregated defaults: %v, %d context and %d generation workers", err, o.ContextWorkers, o.GenerationWorkers)
	}
}
