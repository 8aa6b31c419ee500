package oaiserve

import (
	"slices"

	"bufio"
	"bytes"
	"encoding/json"
	"github.com/tether-project/tether/internal/prefix"
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
	// Nothing cached: vLLM leaves prompt_tokens_details null.
	if first.Object != "chat.completion" || first.Usage.Details != nil {
		t.Fatalf("first: %+v", first)
	}
	if second.Usage.Details.Cached < 40 || second.Usage.Details.Cached%4 != 0 {
		t.Fatalf("second turn cached %d of %d", second.Usage.Details.Cached, second.Usage.PromptTokens)
	}
	// Another rank holds nothing.
	_, b = post(t, s.URL(), "/v1/chat/completions", "0", chat("three"))
	if !strings.Contains(string(b), `"prompt_tokens_details":null`) {
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

// SGLang's errors are the flat ErrorResponse (serving_base.py
// create_error_response), a non-integer rank header's type its status as
// text; vLLM's the OpenAI envelope.
func TestErrorBodies(t *testing.T) {
	sg := Start(Options{Engine: SGLang, Model: "m", DataParallelSize: 2})
	defer sg.Close()
	_, b := post(t, sg.URL(), "/v1/chat/completions", "x", chat("a"))
	var flat map[string]any
	if json.Unmarshal(b, &flat) != nil || flat["object"] != "error" || flat["type"] != "400" || flat["code"] != 400.0 {
		t.Fatalf("sglang bad header: %s", b)
	}
	_, b = post(t, sg.URL(), "/v1/chat/completions", "7", chat("a"))
	if !strings.Contains(string(b), "routed_dp_rank=7 out of range [0, 2)") {
		t.Fatalf("sglang out of range: %s", b)
	}
	vl := Start(Options{Engine: VLLM, Model: "m", DataParallelSize: 2})
	defer vl.Close()
	_, b = post(t, vl.URL(), "/v1/chat/completions", "7", chat("a"))
	var env struct {
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &env) != nil || env.Error.Type != "BadRequestError" {
		t.Fatalf("vllm out of range: %s", b)
	}
}

// The KV events each stand-in publishes, in both live layouts, are what
// tether's consumer reads: every stored block's tether key is the block
// key of the prompt's tokens as an edge with the words tokenizer computes
// it; evictions are BlockRemoved; a flush AllBlocksCleared.
func TestKVEvents(t *testing.T) {
	for _, c := range []struct {
		eng    Engine
		layout Layout
	}{{VLLM, 0}, {VLLM, LayoutArray}, {SGLang, 0}} {
		const bs = 4
		s := Start(Options{Engine: c.eng, Model: "m", DataParallelSize: 2, BlockSize: bs, GPUBlocks: 12,
			KVEvents: &KVEventsOptions{Layout: c.layout, Replay: true}})
		defer s.Close()
		pub, replay := s.KVEventsEndpoints()
		if pub == "" || replay == "" {
			t.Fatalf("%s: endpoints %q %q", c.eng, pub, replay)
		}
		got := subscribe(t, pub, replay, bs)
		body := chat("kv events")
		if st, b := post(t, s.URL(), "/v1/chat/completions", "0", body); st != 200 {
			t.Fatalf("%d %s", st, b)
		}
		tokens, _, _ := promptOf(requestOf(t, body), true)
		want := prefix.BlockHashes(tokens, bs)
		// ZeroMQ's slow joiner: what the PUB sent before the SUB was
		// connected is lost; the next batch (a heartbeat) makes the
		// subscriber replay from sequence 0.
		waitUntil(t, func() bool { s.PublishHeartbeat(); return len(got.stored()) >= len(want) })
		if !slices.Equal(got.stored()[:len(want)], want) {
			t.Fatalf("%s layout %d: stored keys %v, want the prompt's block keys %v", c.eng, c.layout, got.stored(), want)
		}
		// A second, different prompt evicts the first's blocks (12 blocks
		// per rank).
		if st, _ := post(t, s.URL(), "/v1/chat/completions", "0", map[string]any{"model": "m",
			"messages": []any{map[string]any{"role": "user", "content": strings.Repeat("other words entirely ", 10)}}}); st != 200 {
			t.Fatal(st)
		}
		waitUntil(t, func() bool { return len(got.removed()) > 0 })
		s.FlushCache()
		waitUntil(t, func() bool { return got.cleared() })
	}
}
