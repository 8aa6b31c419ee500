package trtllm

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/workertest"
	"github.com/tether-project/tether/worker"
)

// pySign is TensorRT-LLM's signature for payloads whose strings are ASCII
// without <, > and &: there encoding/json's sorted compact output is the
// same bytes as Python's json.dumps(sort_keys=True, separators=(",", ":")).
// It is this test's own, independent of internal/hintauth.
func pySign(t *testing.T, key string, payload map[string]any) string {
	t.Helper()
	m, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.ContainsAny(m, "<>&") || bytes.ContainsFunc(m, func(r rune) bool { return r > 0x7e }) {
		t.Fatalf("pySign needs ASCII without <>&: %s", m)
	}
	h := hmac.New(sha256.New, []byte(key))
	h.Write(m)
	return "sha256=" + hex.EncodeToString(h.Sum(nil))
}

// trtllmFront is a minimal TensorRT-LLM-style disaggregated server
// (tensorrt_llm/serve/openai_disagg_service.py, context first) for chat:
// the context request with disaggregated_params {context_only,
// disagg_request_id, schedule_style}, the handoff from
// choices[0].disaggregated_params, the generation request with it as
// generation_only plus ctx_usage and prompt_token_ids, the signed
// sub-agent hint on both hops (disagg_auth.py
// build_subagent_affinity_headers) and x-trtllm-disagg-auth on the
// generation hop.
type trtllmFront struct {
	t        *testing.T
	ctxURL   string
	genURL   string
	nextID   atomic.Int64
	tamper   atomic.Bool // sign the generation hop's KV fields wrongly
	mu       sync.Mutex
	ctxRanks []string // the context worker's rank per request
}

func (f *trtllmFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req map[string]any
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	conv := r.Header.Get("x-session-id")
	parent := strings.TrimSpace(r.Header.Get(parentHeader))
	req["conversation_params"] = map[string]any{"conversation_id": conv}
	id := 1000 + f.nextID.Add(1)

	hint := func(role, rtype string) map[string]string {
		if parent == "" {
			return map[string]string{}
		}
		return map[string]string{
			HeaderAffinityID: parent,
			HeaderAffinityAuth: pySign(f.t, testKey, map[string]any{
				"purpose": "x-trtllm-subagent-affinity-id", "role": role, "model": req["model"], "conversation_id": conv,
				"subagent_affinity_id": parent, "request_type": rtype, "disagg_request_id": id}),
		}
	}
	ctxReq := map[string]any{}
	for k, v := range req {
		ctxReq[k] = v
	}
	ctxReq["disaggregated_params"] = map[string]any{"request_type": "context_only", "disagg_request_id": id, "schedule_style": "context_first", "conversation_id": nil}
	ctxReq["stream"], ctxReq["stream_options"] = false, nil
	resp, body := f.send(f.ctxURL, ctxReq, hint("CONTEXT", "context_only"))
	if resp.StatusCode != 200 {
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(body)
		return
	}
	f.mu.Lock()
	f.ctxRanks = append(f.ctxRanks, resp.Header.Get(worker.HeaderADPRank))
	f.mu.Unlock()
	var ctxResp struct {
		Choices []struct {
			DP map[string]any `json:"disaggregated_params"`
		} `json:"choices"`
		Usage          map[string]any `json:"usage"`
		PromptTokenIDs []int          `json:"prompt_token_ids"`
	}
	if err := json.Unmarshal(body, &ctxResp); err != nil || len(ctxResp.Choices) != 1 || ctxResp.Choices[0].DP == nil ||
		ctxResp.Choices[0].DP["ctx_request_id"] == nil || ctxResp.Choices[0].DP["disagg_request_id"] == nil {
		http.Error(w, fmt.Sprintf("Context server did not return disaggregated params: %s", body), 500)
		return
	}
	dp := ctxResp.Choices[0].DP
	dp["request_type"], dp["schedule_style"], dp["conversation_id"], dp["ctx_usage"], dp["disagg_request_id"] =
		"generation_only", "context_first", conv, ctxResp.Usage, id
	req["disaggregated_params"] = dp
	req["prompt_token_ids"] = ctxResp.PromptTokenIDs
	h := hint("GENERATION", "generation_only")
	if parent != "" {
		// scope context: the generation fleet routes the child by its own id.
		h = map[string]string{}
	}
	state := dp["encoded_opaque_state"]
	if f.tamper.Load() {
		state = "dGFtcGVyZWQ="
	}
	h[HeaderDisaggAuth] = pySign(f.t, testKey, map[string]any{"ctx_info_endpoint": dp["ctx_info_endpoint"], "encoded_opaque_state": state})
	resp, body = f.send(f.genURL, req, h)
	for _, k := range []string{"Content-Type", worker.HeaderADPRank} {
		w.Header().Set(k, resp.Header.Get(k))
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(body)
}

func (f *trtllmFront) send(url string, body map[string]any, hdr map[string]string) (*http.Response, []byte) {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return &http.Response{StatusCode: 502, Header: http.Header{}}, []byte(err.Error())
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	return resp, rb
}

func startTetherWorker(t *testing.T, id string, fleet telemetry.Fleet, role hintauth.Role) *worker.Server {
	t.Helper()
	cfg := worker.DefaultConfig()
	cfg.InstanceID, cfg.Model, cfg.Fleet, cfg.ServerRole = id, testModel, fleet, role
	cfg.InternalRequestAuthKey = testKey
	cfg.HintSignatureFormats = []string{"trtllm"} // migrated: TensorRT-LLM's formats only
	cfg.ADP.EnableAttentionDP = true
	cfg.ADP.AttentionDP.ConversationAffinity = true
	cfg.Ranks = 4
	cfg.Engine.TimeScale = 0
	cfg.Logger = slog.New(slog.DiscardHandler)
	return workertest.Start(t, worker.New, cfg)
}

// A TensorRT-LLM-style disaggregated server in front of tether workers:
// the workers answer the context phase in choices[0].disaggregated_params,
// accept the generation_only request with the fields TensorRT-LLM's
// server adds (schedule_style, conversation_id, ctx_usage,
// prompt_token_ids), verify its signatures (the sub-agent lands on its
// parent's rank), and refuse a tampered KV-transfer signature (403).
func TestTRTLLMFrontInFrontOfTetherWorkers(t *testing.T) {
	cw := startTetherWorker(t, "ctx-w", telemetry.FleetContext, hintauth.RoleContext)
	gw := startTetherWorker(t, "gen-w", telemetry.FleetGeneration, hintauth.RoleGeneration)
	front := &trtllmFront{t: t, ctxURL: cw.URL(), genURL: gw.URL()}
	fs := httptest.NewServer(front)
	t.Cleanup(fs.Close)
	system := strings.Repeat("shared agent instructions ", 40)
	body := func(user string, stream bool) map[string]any {
		return map[string]any{"model": testModel, "max_tokens": 6, "stream": stream,
			"messages": []any{map[string]any{"role": "system", "content": system}, map[string]any{"role": "user", "content": user}}}
	}
	p := post(t, fs.URL+"/v1/chat/completions", body("plan", false), map[string]string{"x-session-id": "parent-1"})
	if p.status != 200 || !bytes.Contains(p.body, []byte(`"chat.completion"`)) {
		t.Fatalf("parent: %d %s", p.status, p.body)
	}
	// Three children of the parent, one streaming: each verified hint puts
	// the child on the parent's context rank (4 ranks, conversation
	// affinity).
	for i, stream := range []bool{false, true, false} {
		kid := fmt.Sprintf("kid-%d", i)
		a := post(t, fs.URL+"/v1/chat/completions", body("task "+kid, stream), map[string]string{"x-session-id": kid, parentHeader: "parent-1"})
		if a.status != 200 {
			t.Fatalf("%s: %d %s", kid, a.status, a.body)
		}
		if stream && !bytes.Contains(a.body, []byte("data: [DONE]")) {
			t.Fatalf("%s stream: %s", kid, a.body)
		}
	}
	front.mu.Lock()
	ranks := append([]string(nil), front.ctxRanks...)
	front.mu.Unlock()
	if len(ranks) != 4 {
		t.Fatalf("context ranks %v", ranks)
	}
	for i, r := range ranks {
		if r == "" || r != ranks[0] {
			t.Fatalf("context ranks %v: request %d left the parent's rank", ranks, i)
		}
	}
	front.tamper.Store(true)
	a := post(t, fs.URL+"/v1/chat/completions", body("tampered", false), map[string]string{"x-session-id": "kid-t", parentHeader: "parent-1"})
	if a.status != 403 || !strings.Contains(string(a.body), "invalid_disagg_auth") {
		t.Fatalf("tampered KV-transfer signature: %d %s", a.status, a.body)
	}
}
