package oaiserve

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func post(t *testing.T, url, path, rank string, body map[string]any) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, url+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if rank != "" {
		req.Header.Set("x-data-parallel-rank", rank) // read case-insensitively
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func chat(msg string) map[string]any {
	return map[string]any{"model": "m", "max_tokens": 3, "messages": []any{
		map[string]any{"role": "system", "content": strings.Repeat("shared system prompt words ", 10)},
		map[string]any{"role": "user", "content": msg}}}
}

// The rank header as each engine reads it: honoured in range; out of range
// a 400 from both; a non-integer ignored by vLLM (its balancer picks) and
// a 400 from SGLang.
func TestRankHeader(t *testing.T) {
	for _, eng := range []Engine{VLLM, SGLang} {
		s := Start(Options{Engine: eng, Model: "m", DataParallelSize: 4})
		defer s.Close()
		if st, b := post(t, s.URL(), "/v1/chat/completions", "2", chat("a")); st != 200 {
			t.Fatalf("%s rank 2: %d %s", eng, st, b)
		}
		if st, b := post(t, s.URL(), "/v1/chat/completions", "4", chat("b")); st != 400 || !strings.Contains(string(b), "out of range") {
			t.Fatalf("%s rank 4: %d %s", eng, st, b)
		}
		st, b := post(t, s.URL(), "/v1/chat/completions", "two", chat("c"))
		switch {
		case eng == VLLM && st != 200, eng == SGLang && (st != 400 || !strings.Contains(string(b), "must be an integer")):
			t.Fatalf("%s rank two: %d %s", eng, st, b)
		}
		served := s.Served()
		if served[0].Rank != 2 || served[0].Header != "2" {
			t.Fatalf("%s: %+v", eng, served[0])
		}
	}
}

// Chat and completions, JSON and SSE; cached tokens in whole blocks once
// the prefix is on the rank, and only when the engine reports them.
func TestResponses(t *testing.T) {
	s := Start(Options{Engine: VLLM, Model: "m", DataParallelSize: 2, ReportCachedTokens: true, BlockSize: 4})
	defer s.Close()
	var first, second struct {
		Object string `json:"object"`
		Usage  struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      *struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	_, b := post(t, s.URL(), "/v1/chat/completions", "1", chat("one"))
	_ = json.Unmarshal(b, &first)
	_, b = post(t, s.URL(), "/v1/chat/completions", "1", chat("two"))
	_ = json.Unmarshal(b, &second)
	if first.Object != "chat.completion" || first.Usage.Details == nil || first.Usage.Details.Cached != 0 {
		t.Fatalf("first: %s", b)
	}
	if second.Usage.Details.Cached < 40 || second.Usage.Details.Cached%4 != 0 {
		t.Fatalf("second turn cached %d of %d", second.Usage.Details.Cached, second.Usage.PromptTokens)
	}
	// Another rank holds nothing.
	_, b = post(t, s.URL(), "/v1/chat/completions", "0", chat("three"))
	if !strings.Contains(string(b), `"cached_tokens":0`) {
		t.Fatalf("rank 0: %s", b)
	}
	st, b := post(t, s.URL(), "/v1/completions", "", map[string]any{"model": "m", "prompt": "hello there", "max_tokens": 2,
		"stream": true, "stream_options": map[string]any{"include_usage": true}})
	if st != 200 {
		t.Fatalf("stream: %d %s", st, b)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	var events []string
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, d)
		}
	}
	if len(events) != 4 || events[3] != "[DONE]" || !strings.Contains(events[2], `"usage"`) || !strings.Contains(events[0], `"text_completion"`) {
		t.Fatalf("stream events: %q", events)
	}
	if st, _ := post(t, s.URL(), "/v1/chat/completions", "", map[string]any{"model": "other", "messages": []any{}}); st != 404 {
		t.Fatalf("unknown model: %d", st)
	}
	for _, p := range []string{"/health", "/v1/models", "/metrics"} {
		resp, err := http.Get(s.URL() + p)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET %s: %v %v", p, resp, err)
		}
		resp.Body.Close()
	}
	if resp, _ := http.Get(s.URL() + "/readyz"); resp.StatusCode != 404 {
		t.Fatalf("/readyz: %d (vLLM does not serve it)", resp.StatusCode)
	}
	noReport := Start(Options{Engine: SGLang, Model: "m"})
	defer noReport.Close()
	if _, b := post(t, noReport.URL(), "/v1/chat/completions", "", chat("x")); !strings.Contains(string(b), `"prompt_tokens_details":null`) {
		t.Fatalf("without --enable-cache-report: %s", b)
	}
}
