package apireq

import (
	"encoding/json"
	"strings"
	"testing"
)

// A conversation sent whole and the same conversation as a chain of
// previous_response_ids render the same prompt: the first turn's input
// items carry over, its role: system item among them; only its
// instructions do not.
func TestChainedHistoryKeepsSystemInputItems(t *testing.T) {
	first := mustParse(t, Responses, `{"model":"m","instructions":"first instructions","input":[
		{"role":"system","content":"You are a careful agent."},
		{"role":"developer","content":"Answer in English."},
		{"role":"user","content":"q one"}]}`)
	history := append(first.History(), AssistantMessage("a one", "", nil))
	next := mustParse(t, Responses, `{"model":"m","instructions":"second instructions","input":"q two"}`)
	if err := next.WithHistory(history); err != nil {
		t.Fatal(err)
	}
	whole := mustParse(t, Responses, `{"model":"m","instructions":"second instructions","input":[
		{"role":"system","content":"You are a careful agent."},
		{"role":"developer","content":"Answer in English."},
		{"role":"user","content":"q one"},
		{"role":"assistant","content":[{"type":"output_text","text":"a one"}]},
		{"role":"user","content":"q two"}]}`)
	if got, want := chatMessages(t, next), chatMessages(t, whole); got != want {
		t.Fatalf("chained:\n%s\nwhole:\n%s", got, want)
	}
	if strings.Contains(chatMessages(t, next), "first instructions") {
		t.Fatal("the first turn's instructions carried over")
	}
}

// include: ["reasoning.encrypted_content"] and reasoning.summary are read;
// a reasoning item handed back with only its encrypted_content (as Codex
// does with store: false) has its reasoning in the prompt again; a blob
// of another provider's is accepted and not read; a damaged one of
// tether's is OpenAI's invalid_encrypted_content.
func TestEncryptedReasoningAndSummary(t *testing.T) {
	r := mustParse(t, Responses, `{"model":"m","input":"x","include":["reasoning.encrypted_content","message.output_text.logprobs"],"reasoning":{"effort":"low","summary":"auto"}}`)
	if !r.Responses.EncryptedReasoning || r.Responses.ReasoningSummary != "auto" || !r.Thinking {
		t.Fatalf("include/summary not read: %+v thinking %v", r.Responses, r.Thinking)
	}
	if s := mustParse(t, Responses, `{"model":"m","input":"x","reasoning":{"summary":"detailed"}}`); !s.Thinking {
		t.Fatal("a summary asked without an effort must reason")
	}
	if s := mustParse(t, Responses, `{"model":"m","input":"x","reasoning":{"effort":"none","summary":"auto"}}`); s.Thinking {
		t.Fatal("effort none must not reason")
	}
	blob := ReasoningBlob("I should call the tool.")
	withBlob := mustParse(t, Responses, `{"model":"m","store":false,"input":[
		{"role":"user","content":"weather?"},
		{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"Calling the tool."}],"encrypted_content":`+mustJSON(blob)+`},
		{"type":"function_call","call_id":"c1","name":"w","arguments":"{}"},
		{"type":"function_call_output","call_id":"c1","output":"sunny"}]}`)
	plain := mustParse(t, Responses, `{"model":"m","input":[
		{"role":"user","content":"weather?"},
		{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"I should call the tool."}]},
		{"type":"function_call","call_id":"c1","name":"w","arguments":"{}"},
		{"type":"function_call_output","call_id":"c1","output":"sunny"}]}`)
	if got, want := chatMessages(t, withBlob), chatMessages(t, plain); got != want {
		t.Fatalf("encrypted reasoning read back as\n%s\nwant\n%s", got, want)
	}
	if !strings.Contains(string(withBlob.Responses.Input[1]), blob) {
		t.Fatal("the input items as stored must keep the item as sent")
	}
	// Content present: the content is the reasoning, the blob unread.
	both := mustParse(t, Responses, `{"model":"m","input":[{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"mine"}],"encrypted_content":"gAAAAforeign"}]}`)
	if !strings.Contains(chatMessages(t, both), `"reasoning":"mine"`) {
		t.Fatalf("content and blob: %s", chatMessages(t, both))
	}
	// Another provider's blob: accepted, its summary the reasoning.
	foreign := mustParse(t, Responses, `{"model":"m","input":[{"role":"user","content":"go"},{"type":"reasoning","summary":[{"type":"summary_text","text":"Plan."}],"encrypted_content":"gAAAAforeign"}]}`)
	if strings.Contains(chatMessages(t, foreign), "gAAAA") {
		t.Fatalf("a foreign blob rendered: %s", chatMessages(t, foreign))
	}
	for body, param := range map[string]string{
		`{"model":"m","input":[{"type":"reasoning","summary":[],"encrypted_content":"tether-rs1.!!"}]}`: "input[0].encrypted_content",
		`{"model":"m","input":"x","include":"reasoning.encrypted_content"}`:                             "include",
		`{"model":"m","input":"x","include":[7]}`:                                                       "include[0]",
		`{"model":"m","input":"x","reasoning":{"summary":"bogus"}}`:                                     "reasoning.summary",
		`{"model":"m","input":"x","truncation":"bogus"}`:                                                "truncation",
		`{"model":"m","input":"x","user":{"a":1}}`:                                                      "user",
		`{"model":"m","input":"x","prompt_cache_key":7}`:                                                "prompt_cache_key",
	} {
		_, err := Parse(Responses, []byte(body))
		if err == nil || err.Param != param || err.Status != 400 {
			t.Errorf("%s: %+v, want a 400 on %s", body, err, param)
		}
		if err != nil && param == "input[0].encrypted_content" && err.Code != "invalid_encrypted_content" {
			t.Errorf("%s: code %q", body, err.Code)
		}
	}
	// A conversation's items convert alike, errors naming the list.
	hist, err := ItemsHistory([]json.RawMessage{json.RawMessage(`{"type":"message","role":"user","content":"hi"}`)}, "items")
	if err != nil || len(hist) != 1 || !strings.Contains(string(hist[0]), `"hi"`) {
		t.Fatalf("items history %s %v", hist, err)
	}
	if _, err := ItemsHistory([]json.RawMessage{json.RawMessage(`{"type":"bogus"}`)}, "items"); err == nil || !strings.HasPrefix(err.Param, "items[0]") {
		t.Fatalf("a bad item: %+v", err)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
