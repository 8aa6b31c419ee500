package agentapi

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/respid"
	"github.com/tether-project/tether/ops/devstack"
	"github.com/tether-project/tether/test/waitfor"
)

type respObj struct {
	ID                 string           `json:"id"`
	Object             string           `json:"object"`
	Status             string           `json:"status"`
	PreviousResponseID *string          `json:"previous_response_id"`
	OutputRaw          []map[string]any `json:"output"`
	Usage              *struct {
		Input   int `json:"input_tokens"`
		Details struct {
			Cached int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
	} `json:"usage"`
}

func (o respObj) item(typ string) map[string]any {
	for _, it := range o.OutputRaw {
		if it["type"] == typ {
			return it
		}
	}
	return nil
}

func outputText(o respObj) string {
	it := o.item("message")
	if it == nil {
		return ""
	}
	var b strings.Builder
	for _, c := range it["content"].([]any) {
		b.WriteString(c.(map[string]any)["text"].(string))
	}
	return b.String()
}

// Codex- and Agents SDK-shaped traffic through any edge of tether dev:
// the Responses API's shapes, a function call continued by
// previous_response_id through another edge (on the instance that stored
// the response, reading its prefix as cached), structured output,
// reasoning, retrieval, background runs polled, streamed by id from
// starting_after and cancelled, delete and input_items.
func TestResponsesAPIThroughTetherDev(t *testing.T) {
	st := startStack(t, devstack.Options{Edges: 3, TimeScale: 0.2})
	e := st.Edges()
	model := st.Model()
	tools := []any{map[string]any{"type": "function", "name": "get_weather", "description": "weather of a city",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]string{"type": "string"}}, "required": []string{"city"}}}}
	instr := "You are a weather agent. " + words("policy", 300)

	// 1: a function call, stored (the default).
	r := do(t, "POST", e[0].URL()+"/v1/responses", map[string]any{"model": model, "instructions": instr, "tools": tools,
		"input": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_text", "text": "weather in Paris? use get_weather"}}}}}, nil)
	var r1 respObj
	decode(t, r.body, &r1)
	call := r1.item("function_call")
	if r.status != 200 || r1.Object != "response" || r1.Status != "completed" || call == nil || call["name"] != "get_weather" || !respid.Minted(r1.ID) {
		t.Fatalf("turn 1: %d %s", r.status, r.body)
	}
	_, gen1 := route(t, r)
	id1, _ := respid.Decode(r1.ID)
	if id1.Instance != gen1 {
		t.Fatalf("the id names %s, the generation hop was %s", id1.Instance, gen1)
	}

	// 2: the tool's output, continued through another edge, streamed.
	r = do(t, "POST", e[1].URL()+"/v1/responses", map[string]any{"model": model, "instructions": instr, "tools": tools, "stream": true,
		"previous_response_id": r1.ID, "max_output_tokens": 8,
		"input": []any{map[string]any{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny, 21C"}}}, nil)
	if r.status != 200 {
		t.Fatalf("turn 2: %d %s", r.status, r.body)
	}
	if _, gen := route(t, r); gen != gen1 {
		t.Fatalf("turn 2 served by %s; the response it continues is stored on %s", gen, gen1)
	}
	evs := events(t, r.body)
	names := eventNames(evs)
	if names[0] != "response.created" || names[1] != "response.in_progress" || !lastEventOfStatus(evs) {
		t.Fatalf("turn 2 events: %v", names)
	}
	for i, ev := range evs {
		if int(ev.data["sequence_number"].(float64)) != i || ev.data["type"] != ev.name {
			t.Fatalf("event %d (%s): sequence_number %v type %v", i, ev.name, ev.data["sequence_number"], ev.data["type"])
		}
	}
	var r2 respObj
	b, _ := json.Marshal(evs[len(evs)-1].data["response"])
	decode(t, b, &r2)
	if r2.PreviousResponseID == nil || *r2.PreviousResponseID != r1.ID || outputText(r2) == "" || r2.Usage.Details.Cached < 256 {
		t.Fatalf("turn 2 response (the stored prefix must be cached): %s", b)
	}

	// Retrieval through the third edge.
	r = do(t, "GET", e[2].URL()+"/v1/responses/"+r2.ID, nil, nil)
	var got respObj
	decode(t, r.body, &got)
	if r.status != 200 || got.ID != r2.ID || outputText(got) != outputText(r2) {
		t.Fatalf("GET: %d %s", r.status, r.body)
	}

	// Structured output and reasoning.
	r = do(t, "POST", e[2].URL()+"/v1/responses", map[string]any{"model": model, "input": "the weather as JSON", "reasoning": map[string]string{"effort": "medium"},
		"text": map[string]any{"format": map[string]any{"type": "json_schema", "name": "w", "strict": true, "schema": map[string]any{"type": "object",
			"properties": map[string]any{"city": map[string]string{"type": "string"}}, "required": []string{"city"}, "additionalProperties": false}}}}, nil)
	var r3 respObj
	decode(t, r.body, &r3)
	var city map[string]any
	if r.status != 200 || r3.OutputRaw[0]["type"] != "reasoning" || json.Unmarshal([]byte(outputText(r3)), &city) != nil || city["city"] == nil {
		t.Fatalf("structured + reasoning: %d %s", r.status, r.body)
	}

	// Background: queued, polled through other edges until done.
	r = do(t, "POST", e[0].URL()+"/v1/responses", map[string]any{"model": model, "input": "a long answer", "background": true, "max_output_tokens": 40}, nil)
	var bg respObj
	decode(t, r.body, &bg)
	if r.status != 200 || bg.Status != "queued" {
		t.Fatalf("background: %d %s", r.status, r.body)
	}
	waitfor.Reason(t, 30*time.Second, "the background response to complete", func() string {
		r := do(t, "GET", e[1].URL()+"/v1/responses/"+bg.ID, nil, nil)
		var o respObj
		decode(t, r.body, &o)
		if r.status != 200 || (o.Status != "completed" && o.Status != "incomplete") {
			return strconv.Itoa(r.status) + " " + o.Status
		}
		return ""
	})
	// Its events, resumed after sequence number 2 through another edge.
	r = do(t, "GET", e[2].URL()+"/v1/responses/"+bg.ID+"?stream=true&starting_after=2", nil, nil)
	evs = events(t, r.body)
	if r.status != 200 || len(evs) < 3 || evs[0].data["sequence_number"].(float64) != 3 || !lastEventOfStatus(evs) {
		t.Fatalf("resumed stream: %d %v", r.status, eventNames(evs))
	}
	if got := evs[len(evs)-1].data["response"].(map[string]any)["id"]; got != bg.ID {
		t.Fatalf("resumed stream names %v, want the client's id %s", got, bg.ID)
	}

	// Cancel a running background response through another edge.
	r = do(t, "POST", e[0].URL()+"/v1/responses", map[string]any{"model": model, "input": "a very long answer of 2000 words", "background": true, "max_output_tokens": 2000}, nil)
	var long respObj
	decode(t, r.body, &long)
	r = do(t, "POST", e[1].URL()+"/v1/responses/"+long.ID+"/cancel", nil, nil)
	var cancelled respObj
	decode(t, r.body, &cancelled)
	if r.status != 200 || cancelled.Status != "cancelled" || cancelled.ID != long.ID {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}
	r = do(t, "GET", e[2].URL()+"/v1/responses/"+long.ID+"?stream=true", nil, nil)
	if evs := events(t, r.body); r.status != 200 || evs[len(evs)-1].name != "response.failed" {
		t.Fatalf("the cancelled stream: %d %v", r.status, eventNames(evs))
	}
	// Cancelled again: the response as it is, as OpenAI answers.
	r = do(t, "POST", e[2].URL()+"/v1/responses/"+long.ID+"/cancel", nil, nil)
	decode(t, r.body, &cancelled)
	if r.status != 200 || cancelled.Status != "cancelled" || cancelled.ID != long.ID {
		t.Fatalf("second cancel: %d %s", r.status, r.body)
	}
	// A finished response cannot be cancelled.
	if r := do(t, "POST", e[2].URL()+"/v1/responses/"+r2.ID+"/cancel", nil, nil); r.status != 400 {
		t.Fatalf("cancel of a finished response: %d %s", r.status, r.body)
	}

	// input_items, delete, then 404 everywhere.
	r = do(t, "GET", e[1].URL()+"/v1/responses/"+r1.ID+"/input_items?order=asc", nil, nil)
	var items struct {
		Object string           `json:"object"`
		Data   []map[string]any `json:"data"`
	}
	decode(t, r.body, &items)
	if r.status != 200 || items.Object != "list" || len(items.Data) != 1 || items.Data[0]["id"] == nil {
		t.Fatalf("input_items: %d %s", r.status, r.body)
	}
	r = do(t, "DELETE", e[2].URL()+"/v1/responses/"+r1.ID, nil, nil)
	if r.status != 200 || !strings.Contains(string(r.body), `"deleted":true`) || !strings.Contains(string(r.body), r1.ID) {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	for _, n := range e {
		if r := do(t, "GET", n.URL()+"/v1/responses/"+r1.ID, nil, nil); r.status != 404 || !strings.Contains(string(r.body), r1.ID) {
			t.Fatalf("GET after delete via %s: %d %s", n.ID, r.status, r.body)
		}
	}
	// store: false keeps nothing.
	r = do(t, "POST", e[0].URL()+"/v1/responses", map[string]any{"model": model, "input": "x", "store": false}, nil)
	var ns respObj
	decode(t, r.body, &ns)
	if r := do(t, "GET", e[1].URL()+"/v1/responses/"+ns.ID, nil, nil); r.status != 404 {
		t.Fatalf("an unstored response: %d %s", r.status, r.body)
	}
}

// lastEventOfStatus: a Responses stream ends with the event of its
// response's status, as OpenAI streams them: response.completed, or
// response.incomplete for an answer cut off at max_output_tokens (with its
// incomplete_details).
func lastEventOfStatus(evs []sse) bool {
	if len(evs) == 0 {
		return false
	}
	last := evs[len(evs)-1]
	resp, _ := last.data["response"].(map[string]any)
	switch resp["status"] {
	case "completed":
		return last.name == "response.completed"
	case "incomplete":
		details, _ := resp["incomplete_details"].(map[string]any)
		return last.name == "response.incomplete" && details["reason"] == "max_output_tokens"
	}
	return false
}
