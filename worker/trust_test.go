package worker

import (
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/test/crosscheck"
	"github.com/tether-project/tether/test/workertest"
)

const (
	oldKey      = "old-internal-key-0123456789"
	attackerKey = "attacker-key-0123456789abc"
	hintPrompt  = "summarise the repository layout for the parent agent"
)

// contextState runs a context-only request on a plain worker and returns
// its opaque state, so generation-only requests in the table are valid.
func contextState(t *testing.T, prompt string) string {
	t.Helper()
	s := workertest.Start(t, New, testConfig("state-src"))
	r := post(t, testClient(t), s.URL()+"/v1/chat/completions",
		chatBody(prompt, `"disaggregated_params":{"request_type":"context_only","disagg_request_id":"req-7"}`), nil)
	if r.status != 200 {
		t.Fatalf("context run: %d %s", r.status, r.body)
	}
	var resp struct {
		Choices []struct {
			DP struct {
				State string `json:"encoded_opaque_state"`
			} `json:"disaggregated_params"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(r.body, &resp); err != nil || len(resp.Choices) != 1 || resp.Choices[0].DP.State == "" {
		t.Fatalf("no opaque state: %s", r.body)
	}
	return resp.Choices[0].DP.State
}

func TestHintSignatureCases(t *testing.T) {
	genState := contextState(t, hintPrompt)
	type reqSpec struct {
		reqType string // "" (no disaggregated_params), context_only, generation_only
	}
	base := func(role hintauth.Role, rt hintauth.RequestType) hintauth.Fields {
		return hintauth.Fields{Role: role, Model: "test-model", ConversationID: "child-a", AffinityID: "parent-1", RequestType: rt, DisaggRequestID: "req-7"}
	}
	ctxF := base(hintauth.RoleContext, hintauth.RequestContextOnly)
	genF := base(hintauth.RoleGeneration, hintauth.RequestGenerationOnly)
	aggCtxF := base(hintauth.RoleContext, hintauth.RequestAggregated)
	aggCtxF.DisaggRequestID = ""
	tamper := func(f hintauth.Fields, mut func(*hintauth.Fields)) hintauth.Fields { mut(&f); return f }

	cases := []struct {
		name     string
		role     hintauth.Role // server_role
		key      string        // worker's current key ("" none)
		prevKeys []string
		legacy   bool
		reqType  string
		affinity string // x-trtllm-subagent-affinity-id ("" omitted)
		sig      string // x-trtllm-subagent-affinity-auth ("" omitted)
		status   int
		code     string
		outcome  string // hint metric outcome
	}{
		{"valid context", "context", testKey, nil, false, "context_only", "parent-1", hintauth.Sign([]byte(testKey), ctxF), 200, "", hintVerified},
		{"valid generation", "generation", testKey, nil, false, "generation_only", "parent-1", hintauth.Sign([]byte(testKey), genF), 200, "", hintVerified},
		{"valid aggregated on a role worker", "context", testKey, nil, false, "", "parent-1", hintauth.Sign([]byte(testKey), aggCtxF), 200, "", hintVerified},
		{"tampered affinity id", "context", testKey, nil, false, "context_only", "parent-2", hintauth.Sign([]byte(testKey), ctxF), 403, "invalid_subagent_affinity_signature", hintInvalid},
		{"tampered child", "context", testKey, nil, false, "context_only", "parent-1",
			hintauth.Sign([]byte(testKey), tamper(ctxF, func(f *hintauth.Fields) { f.ConversationID = "child-b" })), 403, "invalid_subagent_affinity_signature", hintInvalid},
		{"tampered role", "context", testKey, nil, false, "context_only", "parent-1",
			hintauth.Sign([]byte(testKey), tamper(ctxF, func(f *hintauth.Fields) { f.Role = hintauth.RoleGeneration })), 403, "invalid_subagent_affinity_signature", hintInvalid},
		{"tampered model", "context", testKey, nil, false, "context_only", "parent-1",
			hintauth.Sign([]byte(testKey), tamper(ctxF, func(f *hintauth.Fields) { f.Model = "other-model" })), 403, "invalid_subagent_affinity_signature", hintInvalid},
		{"tampered request type", "context", testKey, nil, false, "context_only", "parent-1",
			hintauth.Sign([]byte(testKey), tamper(ctxF, func(f *hintauth.Fields) { f.RequestType = hintauth.RequestAggregated })), 403, "invalid_subagent_affinity_signature", hintInvalid},
		{"tampered request id", "context", testKey, nil, false, "context_only", "parent-1",
			hintauth.Sign([]byte(testKey), tamper(ctxF, func(f *hintauth.Fields) { f.DisaggRequestID = "req-8" })), 403, "invalid_subagent_affinity_signature", hintInvalid},
		{"wrong key", "context", testKey, nil, false, "context_only", "parent-1", hintauth.Sign([]byte(attackerKey), ctxF), 403, "invalid_subagent_affinity_signature", hintInvalid},
		{"missing signature", "context", testKey, nil, false, "context_only", "parent-1", "", 401, "missing_subagent_affinity_signature", hintMissing},
		{"malformed signature", "context", testKey, nil, false, "context_only", "parent-1", "v1:abc", 403, "invalid_subagent_affinity_signature", hintMalformed},
		{"unknown signature version", "context", testKey, nil, false, "context_only", "parent-1",
			"v2:" + strings.TrimPrefix(hintauth.Sign([]byte(testKey), ctxF), "v1:"), 403, "invalid_subagent_affinity_signature", hintMalformed},
		{"signature without affinity id", "context", testKey, nil, false, "context_only", "", hintauth.Sign([]byte(testKey), ctxF), 403, "invalid_subagent_affinity_signature", hintBadFields},
		{"rotation: previous key accepted", "context", testKey, []string{oldKey}, false, "context_only", "parent-1", hintauth.Sign([]byte(oldKey), ctxF), 200, "", hintVerified},
		{"rotation: removed key rejected", "context", testKey, nil, false, "context_only", "parent-1", hintauth.Sign([]byte(oldKey), ctxF), 403, "invalid_subagent_affinity_signature", hintInvalid},
		{"no role, aggregated: invalid signature ignored", "", testKey, nil, false, "", "parent-1", "v1:garbage", 200, "", hintIgnored},
		{"no role, aggregated: missing signature ignored", "", testKey, nil, false, "", "parent-1", "", 200, "", hintIgnored},
		{"inferred context role: context signature", "", testKey, nil, false, "context_only", "parent-1", hintauth.Sign([]byte(testKey), ctxF), 200, "", hintVerified},
		{"inferred context role: generation signature fails", "", testKey, nil, false, "context_only", "parent-1",
			hintauth.Sign([]byte(testKey), tamper(ctxF, func(f *hintauth.Fields) { f.Role = hintauth.RoleGeneration })), 403, "invalid_subagent_affinity_signature", hintInvalid},
		{"inferred context role: unsigned rejected", "", testKey, nil, false, "context_only", "parent-1", "", 401, "missing_subagent_affinity_signature", hintMissing},
		{"inferred generation role: generation signature", "", testKey, nil, false, "generation_only", "parent-1", hintauth.Sign([]byte(testKey), genF), 200, "", hintVerified},
		{"inferred generation role: context signature fails", "", testKey, nil, false, "generation_only", "parent-1",
			hintauth.Sign([]byte(testKey), tamper(genF, func(f *hintauth.Fields) { f.Role = hintauth.RoleContext })), 403, "invalid_subagent_affinity_signature", hintInvalid},
		{"explicit role wins: context-signed request to a generation worker", "generation", testKey, nil, false, "context_only", "parent-1", hintauth.Sign([]byte(testKey), ctxF), 403, "invalid_subagent_affinity_signature", hintInvalid},
		{"explicit role wins: signed for the configured role", "generation", testKey, nil, false, "context_only", "parent-1",
			hintauth.Sign([]byte(testKey), tamper(ctxF, func(f *hintauth.Fields) { f.Role = hintauth.RoleGeneration })), 200, "", hintVerified},
		{"role worker, aggregated, invalid signature", "context", testKey, nil, false, "", "parent-1", hintauth.Sign([]byte(testKey), ctxF), 403, "invalid_subagent_affinity_signature", hintInvalid},
		{"legacy mode ignores headers", "context", testKey, nil, true, "context_only", "parent-1", "v1:garbage", 200, "", hintIgnored},
		{"no key configured", "context", "", nil, false, "context_only", "parent-1", hintauth.Sign([]byte(testKey), ctxF), 403, "invalid_subagent_affinity_signature", hintNoKey},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig("w-hint")
			cfg.ServerRole = tc.role
			cfg.InternalRequestAuthKey = tc.key
			cfg.PreviousInternalRequestAuthKeys = tc.prevKeys
			cfg.IgnoreSubagentHints = tc.legacy
			s := workertest.Start(t, New, cfg)
			extra := `"max_tokens":2`
			switch tc.reqType {
			case "context_only":
				extra += `,"disaggregated_params":{"request_type":"context_only","disagg_request_id":"req-7"}`
			case "generation_only":
				extra += `,"disaggregated_params":{"request_type":"generation_only","disagg_request_id":"req-7","opaque_state":` + strconv.Quote(genState) + `}`
			}
			hdr := map[string]string{"x-session-id": "child-a"}
			if tc.affinity != "" {
				hdr[hintauth.HeaderAffinityID] = tc.affinity
			}
			if tc.sig != "" {
				hdr[hintauth.HeaderAffinityAuth] = tc.sig
			}
			r := post(t, testClient(t), s.URL()+"/v1/chat/completions", chatBody(hintPrompt, extra), hdr)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			if tc.code != "" {
				m := r.json(t)
				e, _ := m["error"].(map[string]any)
				if e == nil || e["code"] != tc.code || e["message"] == "" {
					t.Fatalf("error %v, want code %s", m, tc.code)
				}
			}
			if got := testutilCounter(t, s, "tether_worker_hint_verifications_total", "outcome", tc.outcome); got != 1 {
				t.Fatalf("outcome %s counted %v times, want 1", tc.outcome, got)
			}
			if tc.status >= 400 {
				if got := testutilCounter(t, s, "tether_worker_hint_verification_failures_total", "reason", tc.outcome); got != 1 {
					t.Fatalf("failure reason %s counted %v times, want 1", tc.outcome, got)
				}
			}
		})
	}
}

// testutilCounter reads one labelled counter from the server's registry.
func testutilCounter(t *testing.T, s *Server, name, label, value string) float64 {
	t.Helper()
	mfs, err := s.metrics.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// signedChild returns headers for a sub-agent request of child under parent.
func signedChild(child, parent string, role hintauth.Role, rt hintauth.RequestType, reqID string) map[string]string {
	f := hintauth.Fields{Role: role, Model: "test-model", ConversationID: child, AffinityID: parent, RequestType: rt, DisaggRequestID: reqID}
	return map[string]string{
		"x-session-id":              child,
		hintauth.HeaderAffinityID:   parent,
		hintauth.HeaderAffinityAuth: hintauth.Sign([]byte(testKey), f),
	}
}

func TestVerifiedSubagentsLandOnParentRank(t *testing.T) {
	cfg := testConfig("ctx-0")
	cfg.Ranks = 4
	cfg.ServerRole = hintauth.RoleContext
	s := workertest.Start(t, New, cfg)
	c := testClient(t)
	url := s.URL() + "/v1/chat/completions"
	ctxOnly := func(id string) string {
		return chatBody(hintPrompt, `"disaggregated_params":{"request_type":"context_only","disagg_request_id":"`+id+`"}`)
	}
	parent := post(t, c, url, ctxOnly("p-1"), map[string]string{"x-session-id": "parent-1"})
	if parent.status != 200 {
		t.Fatalf("parent: %d %s", parent.status, parent.body)
	}
	home := parent.header.Get(HeaderADPRank)
	unsignedRanks := map[string]bool{}
	for i := 0; i < 6; i++ {
		child := "child-" + strconv.Itoa(i)
		id := "c-" + strconv.Itoa(i)
		r := post(t, c, url, ctxOnly(id), signedChild(child, "parent-1", hintauth.RoleContext, hintauth.RequestContextOnly, id))
		if r.status != 200 {
			t.Fatalf("child %d: %d %s", i, r.status, r.body)
		}
		if got := r.header.Get(HeaderADPRank); got != home {
			t.Fatalf("signed child %d on rank %s, parent on %s", i, got, home)
		}
		// The same children without the hint are new conversations,
		// spread round-robin over the ranks.
		r = post(t, c, url, ctxOnly("u-"+id), map[string]string{"x-session-id": "solo-" + child})
		unsignedRanks[r.header.Get(HeaderADPRank)] = true
	}
	if len(unsignedRanks) < 3 {
		t.Fatalf("unhinted conversations used ranks %v; the test cannot tell affinity from chance", unsignedRanks)
	}
}

func TestAggregatedWithoutRoleRoutesByOwnConversation(t *testing.T) {
	cfg := testConfig("agg-0")
	cfg.Ranks = 2
	s := workertest.Start(t, New, cfg)
	c := testClient(t)
	url := s.URL() + "/v1/chat/completions"
	own := post(t, c, url, chatBody("first turn", ""), map[string]string{"x-session-id": "child-a"})
	parent := post(t, c, url, chatBody("parent turn", ""), map[string]string{"x-session-id": "parent-1"})
	if own.header.Get(HeaderADPRank) == parent.header.Get(HeaderADPRank) {
		t.Fatalf("setup: both conversations on rank %s", own.header.Get(HeaderADPRank))
	}
	for _, sig := range []string{"", "v1:not-a-signature", hintauth.Sign([]byte(attackerKey), hintauth.Fields{})} {
		hdr := map[string]string{"x-session-id": "child-a", hintauth.HeaderAffinityID: "parent-1"}
		if sig != "" {
			hdr[hintauth.HeaderAffinityAuth] = sig
		}
		r := post(t, c, url, chatBody("second turn", ""), hdr)
		if r.status != 200 {
			t.Fatalf("sig %q: %d %s", sig, r.status, r.body)
		}
		if got := r.header.Get(HeaderADPRank); got != own.header.Get(HeaderADPRank) {
			t.Fatalf("sig %q: routed to rank %s (parent's), want its own conversation's rank %s", sig, got, own.header.Get(HeaderADPRank))
		}
	}
}

// signTRTLLMInPython signs a hint as TensorRT-LLM does
// (tensorrt_llm/serve/disagg_auth.py _sign_subagent_affinity), with
// python3's json and hmac modules; ok is false without python3.
func signTRTLLMInPython(t *testing.T, key string, payload map[string]any) (string, bool) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		return "", false
	}
	in, _ := json.Marshal(map[string]any{"key": key, "payload": payload})
	const script = `import hashlib, hmac, json, sys
r = json.load(sys.stdin)
m = json.dumps(r["payload"], sort_keys=True, separators=(",", ":")).encode("utf-8")
print("sha256=" + hmac.new(r["key"].encode("utf-8"), m, hashlib.sha256).hexdigest())`
	cmd := exec.Command(py, "-c", script)
	cmd.Stdin = strings.NewReader(string(in))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	return strings.TrimSpace(string(out)), true
}

// TensorRT-LLM-format hints: one signed by TensorRT-LLM's algorithm
// (python3 when installed, else this package's signer, which the
// committed vectors tie to python3) verifies; tampered ones and a format
// the worker does not accept are refused with 403 and a clear message.
func TestTRTLLMFormatHints(t *testing.T) {
	const conv, parent = "child-é <a>&\U0001F600", "parent-1"
	payload := map[string]any{
		"purpose": "x-trtllm-subagent-affinity-id", "role": "CONTEXT", "model": "test-model",
		"conversation_id": conv, "subagent_affinity_id": parent, "request_type": "context_only", "disagg_request_id": 7,
	}
	sig, fromPython := signTRTLLMInPython(t, testKey, payload)
	if !fromPython && crosscheck.Required() {
		t.Fatal("python3 is not installed, and CI requires the hint to be signed by it")
	}
	if !fromPython {
		t.Log("python3 not installed: signing with internal/hintauth (checked against python3's output by the committed vectors)")
		var err error
		sig, err = hintauth.SignTRTLLM([]byte(testKey), hintauth.Fields{Role: hintauth.RoleContext, Model: "test-model",
			ConversationID: conv, AffinityID: parent, RequestType: hintauth.RequestContextOnly, DisaggRequestID: "7"})
		if err != nil {
			t.Fatal(err)
		}
	}
	send := func(t *testing.T, s *Server, dp, sig string) response {
		body := chatBody(hintPrompt, `"max_tokens":2,"conversation_params":{"conversation_id":`+strconv.Quote(conv)+`},"disaggregated_params":`+dp)
		return post(t, testClient(t), s.URL()+"/v1/chat/completions", body,
			map[string]string{hintauth.HeaderAffinityID: parent, hintauth.HeaderAffinityAuth: sig})
	}
	const dp = `{"request_type":"context_only","disagg_request_id":7}`
	s := workertest.Start(t, New, testConfig("w-trtllm"))
	if r := send(t, s, dp, sig); r.status != 200 {
		t.Fatalf("TensorRT-LLM-signed hint: %d %s", r.status, r.body)
	}
	if got := testutilCounter(t, s, "tether_worker_hint_verifications_total", "outcome", hintVerified); got != 1 {
		t.Fatalf("verified %v times", got)
	}
	for name, c := range map[string]struct{ dp, sig string }{
		"other request id": {`{"request_type":"context_only","disagg_request_id":8}`, sig},
		"uppercase hex":    {dp, "sha256=" + strings.ToUpper(strings.TrimPrefix(sig, "sha256="))},
		"flipped digit":    {dp, sig[:len(sig)-1] + map[bool]string{true: "1", false: "0"}[sig[len(sig)-1] == '0']},
	} {
		t.Run(name, func(t *testing.T) {
			r := send(t, s, c.dp, c.sig)
			if r.status != 403 || !strings.Contains(string(r.body), "invalid_subagent_affinity_signature") {
				t.Fatalf("%d %s, want 403 invalid_subagent_affinity_signature", r.status, r.body)
			}
		})
	}
	cfg := testConfig("w-v1-only")
	cfg.HintSignatureFormats = []string{"tether-v1"}
	s1 := workertest.Start(t, New, cfg)
	r := send(t, s1, dp, sig)
	if r.status != 403 || !strings.Contains(string(r.body), "not accepted") {
		t.Fatalf("trtllm hint on a tether-v1-only worker: %d %s", r.status, r.body)
	}
}
