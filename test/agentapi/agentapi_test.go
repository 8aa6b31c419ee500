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
		client.CloseIdleConnections()
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

// client is the tests' HTTP client (idle connections closed at the end,
// for the leak check).
var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}, Timeout: 60 * time.Second}

func do(t *testing.T, method, url string, body any, hdr map[string]string) reply {
	t.Helper()
	r, err := try(method, url, body, hdr)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return r
}

// try is do without failing the test: a transport error is returned.
func try(method, url string, body any, hdr map[string]string) (reply, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return reply{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("reading: %w", err)
	}
	return reply{resp.StatusCode, resp.Header, b}, nil
}

type sse struct {
	name string
	data map[string]any
}

func events(t *testing.T, b []byte) []sse {
	t.Helper()
	evs, err := eventsOf(b)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// eventsOf parses an SSE body.
func eventsOf(b []byte) ([]sse, error) {
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
					return out, fmt.Errorf("event data %q: %v", d, err)
				}
			}
			out = append(out, ev)
			name = ""
		}
	}
	return out, nil
}

func words(prefix string, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return strings.Join(w, " ")
}

// route is the instances of x-tether-route ("context=ctx-1/0;
// generation=gen-2/1", "-" for a hop that did not happen).
func route(t *testing.T, r reply) (ctxInst, genInst string) {
	t.Helper()
	ctxInst, genInst = routeOf(r)
	if ctxInst == "" && genInst == "" {
		t.Fatalf("no x-tether-route in %v", r.header)
	}
	return ctxInst, genInst
}

// routeOf is route without a test to fail ("" and "" without a header).
func routeOf(r reply) (ctxInst, genInst string) {
	v := r.header.Get(edge.HeaderRoute)
	for _, part := range strings.Split(v, ";") {
		k, val, _ := strings.Cut(strings.TrimSpace(part), "=")
		inst, _, _ := strings.Cut(val, "/")
		switch k {
		case "context":
			ctxInst = inst
		case "generation":
			genInst = inst
		}
	}
	return ctxInst, genInst
}

func decode(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
}

// eventNames are the events' names in order.
func eventNames(evs []sse) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.name
	}
	return out
}
