package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/ops/devstack"
)

func smallStack(t *testing.T) *devstack.Stack {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := devstack.Start(ctx, devstack.Options{Edges: 1, ContextWorkers: 1, GenerationWorkers: 1, Ranks: 1, Logger: logger(),
		EdgeConfig: func(_ int, c *edge.Config) { c.MaxBodyBytes = 1 << 20 }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		if err := st.Close(cctx); err != nil {
			t.Errorf("close stack: %v", err)
		}
	})
	if err := st.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return st
}

// clusterView is what an unauthenticated admin call could change: the
// members, the leader and (by a snapshot restore) the log position.
func clusterView(t *testing.T, st *devstack.Stack) (peers string, leader string, index uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ci, err := st.Edges()[0].Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, p := range ci.Peers {
		ids = append(ids, p.ID+"@"+p.Addr)
	}
	return strings.Join(ids, ","), ci.Leader, ci.StateIndex
}

// Without the admin token nothing can be read or changed: every admin
// endpoint, every method, every way of getting the token wrong is a 401
// OpenAI error; members and leader are unchanged and no restore rewound the
// log (the leader's own duties keep appending, so the hash itself moves).
func TestAdminAPIRefusesClientsWithoutTheToken(t *testing.T) {
	st := smallStack(t)
	c := httpClient(t)
	base := st.Edges()[0].URL() + "/admin/v1/"
	peers0, leader0, index0 := clusterView(t, st)
	paths := []struct{ method, path string }{
		{"GET", "cluster"}, {"GET", "instances"}, {"GET", "state/hash"}, {"GET", "snapshot"},
		{"POST", "snapshot/restore"}, {"POST", "raft/remove-peer"}, {"POST", "raft/transfer-leader"},
		{"POST", "raft/add-voter"}, {"GET", "bindings/context/k"}, {"GET", "bindings/context/k/history"},
		{"DELETE", "cluster"}, {"GET", "nonexistent"},
	}
	auths := map[string]string{
		"none":           "",
		"wrong token":    "Bearer not-the-admin-token-0123456789",
		"basic scheme":   "Basic " + st.AdminToken(),
		"token no space": "Bearer" + st.AdminToken(),
		"prefix only":    "Bearer " + st.AdminToken()[:len(st.AdminToken())-1],
		"internal key":   "Bearer " + st.InternalKey(),
	}
	for _, p := range paths {
		for name, auth := range auths {
			req, _ := http.NewRequest(p.method, base+p.path+"?token="+st.AdminToken(), strings.NewReader(`{"id":"edge-1","addr":"127.0.0.1:1"}`))
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("%s %s with %s: status %d: %s", p.method, p.path, name, resp.StatusCode, b)
			}
			var e openAIError
			if json.Unmarshal(b, &e) != nil || e.Error == nil || e.Error.Type != "authentication_error" || e.Error.Code == nil ||
				*e.Error.Code != "unauthorized" || !strings.Contains(e.Error.Message, "Authorization: Bearer") {
				t.Fatalf("%s %s with %s: not an authentication_error with code unauthorized naming the Bearer token: %s", p.method, p.path, name, b)
			}
		}
	}
	peers1, leader1, index1 := clusterView(t, st)
	if peers1 != peers0 || leader1 != leader0 || index1 < index0 {
		t.Fatalf("unauthenticated admin calls changed the cluster: peers %s → %s, leader %s → %s, index %d → %d",
			peers0, peers1, leader0, leader1, index0, index1)
	}
}

// The edge's bad-input catalogue beyond its package tests: every error is
// OpenAI JSON (or the HTTP server's own 431), and the edge still serves.
func TestEdgeHTTPBadInput(t *testing.T) {
	st := smallStack(t)
	c := httpClient(t)
	url := st.Edges()[0].URL() + "/v1/chat/completions"
	chatBody := func(content string) string {
		b, _ := json.Marshal(map[string]any{"model": st.Model(), "max_tokens": 2, "messages": []map[string]string{{"role": "user", "content": content}}})
		return string(b)
	}
	do := func(method, u, body string, hdr map[string]string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, u, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, u, err)
		}
		return resp
	}
	cases := []struct {
		name, method, url, body string
		hdr                     map[string]string
		status                  int
	}{
		{"malformed JSON", "POST", url, `{"model":`, nil, 400},
		{"wrong types", "POST", url, `{"model":1,"messages":"x"}`, nil, 400},
		{"empty messages", "POST", url, `{"model":"` + st.Model() + `","messages":[]}`, nil, 400},
		{"empty body", "POST", url, ``, nil, 400},
		{"unknown model", "POST", url, `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, nil, 404},
		{"unknown endpoint", "POST", st.Edges()[0].URL() + "/v1/embeddings", `{}`, nil, 404},
		{"wrong method", "GET", url, ``, nil, 405},
		{"sub-agent cycle (self parent)", "POST", url, chatBody("x"), map[string]string{"x-session-id": "c1", devstack.ParentHeader: "c1"}, 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := do(tc.method, tc.url, tc.body, tc.hdr)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			var e openAIError
			if json.Unmarshal(b, &e) != nil || e.Error == nil || e.Error.Message == "" {
				t.Fatalf("not an OpenAI error: %s", b)
			}
		})
	}
	t.Run("oversized body", func(t *testing.T) {
		resp := do("POST", url, chatBody(strings.Repeat("x", 2<<20)), nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d: %.200s", resp.StatusCode, b)
		}
	})
	t.Run("huge header value", func(t *testing.T) {
		resp := do("POST", url, chatBody("x"), map[string]string{"X-Junk": strings.Repeat("a", 2<<20)})
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("status %d, want 431", resp.StatusCode)
		}
	})
	t.Run("invalid UTF-8", func(t *testing.T) {
		resp := do("POST", url, strings.Replace(chatBody("hi XX"), "XX", "\xff\xfe", 1), nil)
		resp.Body.Close()
		if resp.StatusCode != 200 && resp.StatusCode != 400 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	})
	t.Run("client-supplied internal hint headers are stripped", func(t *testing.T) {
		// A forged signature would make the worker answer 403 if the edge
		// forwarded it; stripped, the request is served.
		f := hintauth.Fields{Role: hintauth.RoleContext, Model: st.Model(), ConversationID: "victim", AffinityID: "attacker-root", RequestType: hintauth.RequestContextOnly}
		resp := do("POST", url, chatBody("x"), map[string]string{
			"x-session-id":               "victim",
			hintauth.HeaderAffinityID:    "attacker-root",
			hintauth.HeaderAffinityAuth:  hintauth.Sign([]byte("attacker-key-0123456789"), f),
			"X-Tether-Internal-Anything": "x",
		})
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
	})
	t.Run("slow client does not block others", func(t *testing.T) {
		conn, err := net.Dial("tcp", st.Edges()[0].Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, _ = conn.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mo"))
		resp := do("POST", url, chatBody("still served"), nil)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d while a slow client stalls", resp.StatusCode)
		}
	})
	t.Run("request flood", func(t *testing.T) {
		const n = 300
		var wg sync.WaitGroup
		var mu sync.Mutex
		count := map[int]int{}
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest("POST", url, bytes.NewReader([]byte(chatBody(fmt.Sprintf("flood %d", i)))))
				req.Header.Set("x-session-id", fmt.Sprintf("flood-%d", i))
				resp, err := c.Do(req)
				st := -1
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					st = resp.StatusCode
				}
				mu.Lock()
				count[st]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		for code, k := range count {
			if code != 200 && code != 429 && code != 503 {
				t.Fatalf("flood: %d requests ended with %d (all %v)", k, code, count)
			}
		}
		t.Logf("flood of %d: %v", n, count)
	})
	resp := do("POST", url, chatBody("after the catalogue"), nil)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("edge unhealthy after the catalogue: %d", resp.StatusCode)
	}
}
