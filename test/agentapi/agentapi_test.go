// Package agentapi drives the agents' own APIs — the Anthropic Messages API
// and the OpenAI Responses API — through every edge of an in-process
// tether dev stack (ops/devstack): their wire shapes streamed and not, the
// stored responses' hard affinity from any edge, and a stream the edge
// cannot finish.
package agentapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/ops/devstack"
	"github.com/tether-project/tether/test/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func startStack(t *testing.T, o devstack.Options) *devstack.Stack {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := devstack.Start(ctx, o)
	if err != nil {
		t.Fatalf("devstack: %v", err)
	}
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		if err := st.Close(cctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	if err := st.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return st
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func do(t *testing.T, method, url string, body any, hdr map[string]string) reply {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading: %v", method, url, err)
	}
	return reply{resp.StatusCode, resp.Header, b}
}

type sse struct {
	name string
	data map[string]any
}

func events(t *testing.T, b []byte) []sse {
	t.Helper()
	var out []sse
	var name string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			d := strings.TrimPrefix(line, "data: ")
			ev := sse{name: name}
			if d != "[DONE]" {
				if err := json.Unmarshal([]byte(d), &ev.data); err != nil {
					t.Fatalf("event data %q: %v", d, err)
				}
			}
			out = append(out, ev)
			name = ""
		}
	}
	return out
}

func words(prefix string, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return strings.Join(w, " ")
}

func TestSmoke(t *testing.T) {
	st := startStack(t, devstack.Options{Edges: 3})
	model := st.Model()
	e := st.Edges()
	msg := map[string]any{"model": model, "max_tokens": 8, "system": words("sys", 100),
		"messages": []any{map[string]any{"role": "user", "content": "hello there"}}}
	r := do(t, "POST", e[0].URL()+"/v1/messages", msg, map[string]string{"x-claude-code-session-id": "cc-1", "anthropic-version": "2023-06-01"})
	t.Logf("messages %d %s %s", r.status, r.header.Get(edge.HeaderRoute), r.body)
	msg["stream"] = true
	r = do(t, "POST", e[1].URL()+"/v1/messages", msg, map[string]string{"x-claude-code-session-id": "cc-1"})
	t.Logf("messages stream %d %s\n%s", r.status, r.header.Get(edge.HeaderRoute), r.body)
	resp := map[string]any{"model": model, "input": "hi " + words("in", 80), "max_output_tokens": 6}
	r = do(t, "POST", e[0].URL()+"/v1/responses", resp, nil)
	t.Logf("responses %d %s %s", r.status, r.header.Get(edge.HeaderRoute), r.body)
	var obj struct{ ID string }
	_ = json.Unmarshal(r.body, &obj)
	r = do(t, "GET", e[2].URL()+"/v1/responses/"+obj.ID, nil, nil)
	t.Logf("get %d %s", r.status, r.body)
	resp["previous_response_id"] = obj.ID
	resp["input"] = "and more"
	resp["stream"] = true
	r = do(t, "POST", e[1].URL()+"/v1/responses", resp, nil)
	t.Logf("chained %d %s\n%s", r.status, r.header.Get(edge.HeaderRoute), r.body)
}
