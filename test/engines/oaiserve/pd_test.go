package oaiserve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

func postJSON(t *testing.T, u string, body any, hdr map[string]string) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, u, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func with(body map[string]any, kv ...any) map[string]any {
	out := map[string]any{}
	for k, v := range body {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

// prefillParams is what the proxies send a vLLM prefill server.
var prefillParams = map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
	"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}

func vllmPrefill(t *testing.T, p *Server, body map[string]any) map[string]any {
	t.Helper()
	st, b := postJSON(t, p.URL()+"/v1/chat/completions", with(body, "kv_transfer_params", prefillParams, "max_tokens", 1, "stream", false),
		map[string]string{"X-Request-Id": hexID()})
	if st != 200 {
		t.Fatalf("prefill: %d %s", st, b)
	}
	var ans map[string]any
	if err := json.Unmarshal(b, &ans); err != nil {
		t.Fatal(err)
	}
	kv, ok := ans["kv_transfer_params"].(map[string]any)
	if !ok {
		t.Fatalf("prefill answer without kv_transfer_params: %s", b)
	}
	return kv
}

// The NixlConnector handoff: the prefill's answer names its blocks, the
// decode reads them (computing only the last prompt token) once; a second
// read of the same transfer, another engine id and unknown blocks fail.
func TestVLLMPrefillDecodeHandoff(t *testing.T) {
	p := Start(Options{Engine: VLLM, Model: "m", ReportCachedTokens: true, PD: &PDOptions{Role: PDPrefill}})
	defer p.Close()
	d := Start(Options{Engine: VLLM, Model: "m", ReportCachedTokens: true, PD: &PDOptions{Role: PDDecode}})
	defer d.Close()
	body := chat("handoff")
	kv := vllmPrefill(t, p, body)
	for _, k := range []string{"remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host", "remote_port", "tp_size"} {
		if _, ok := kv[k]; !ok {
			t.Fatalf("kv_transfer_params lacks %s: %v", k, kv)
		}
	}
	if kv["do_remote_prefill"] != true || kv["do_remote_decode"] != false {
		t.Fatalf("kv_transfer_params %v", kv)
	}
	st, b := postJSON(t, d.URL()+"/v1/chat/completions", with(body, "kv_transfer_params", kv), nil)
	if st != 200 {
		t.Fatalf("decode: %d %s", st, b)
	}
	sv := d.Served()[0]
	if sv.Handoff != HandoffDecode || sv.Computed != 1 || sv.Transferred != sv.PromptTokens-1 || sv.KVMismatch {
		t.Fatalf("decode served %+v", sv)
	}
	if ps := p.Served()[0]; ps.Handoff != HandoffPrefill || ps.Computed != ps.PromptTokens {
		t.Fatalf("prefill served %+v", ps)
	}
	// The blocks were freed by the read: the same transfer again fails
	// with the engine's GenerationError.
	st, b = postJSON(t, d.URL()+"/v1/chat/completions", with(body, "kv_transfer_params", kv), nil)
	if st != 500 || !strings.Contains(string(b), `"type":"InternalServerError"`) || !strings.Contains(string(b), "Internal server error") {
		t.Fatalf("second read: %d %s", st, b)
	}
	// Another engine's id (a transfer meant for another prefill engine).
	kv2 := vllmPrefill(t, p, chat("other engine"))
	kv2["remote_engine_id"] = "another-engine_dp0"
	if st, b := postJSON(t, d.URL()+"/v1/chat/completions", with(chat("other engine"), "kv_transfer_params", kv2), nil); st != 500 {
		t.Fatalf("engine id mismatch: %d %s", st, b)
	}
	// A prompt mismatching the blocks' tokens is not checked by the
	// engine: the stand-in records it so tests can assert it never
	// happens.
	kv3 := vllmPrefill(t, p, chat("one prompt"))
	if st, b := postJSON(t, d.URL()+"/v1/chat/completions", with(chat("another prompt"), "kv_transfer_params", kv3), nil); st != 200 {
		t.Fatalf("mismatched prompt: %d %s", st, b)
	}
	if last := d.Served()[len(d.Served())-1]; !last.KVMismatch {
		t.Fatalf("mismatched prompt not recorded: %+v", last)
	}
}

// Params asking for a remote prefill without the fields to read it are
// computed locally, as update_state_after_alloc does; a failed read under
// kv_load_failure_policy recompute too. Streamed, a failed read is the role
// chunk and the error event.
func TestVLLMDecodeRefusesBadHandoff(t *testing.T) {
	d := Start(Options{Engine: VLLM, Model: "m", PD: &PDOptions{Role: PDDecode}})
	defer d.Close()
	bad := map[string]any{"do_remote_prefill": true, "remote_block_ids": []int{1, 2}, "remote_host": "127.0.0.1"}
	if st, b := postJSON(t, d.URL()+"/v1/chat/completions", with(chat("x"), "kv_transfer_params", bad), nil); st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	if sv := d.Served()[0]; sv.Handoff != HandoffDecodeInvalidParams || sv.Computed != sv.PromptTokens {
		t.Fatalf("%+v", sv)
	}
	if w := d.Warnings(); len(w) != 1 || !strings.Contains(w[0], "Got invalid KVTransferParams") {
		t.Fatalf("warnings %q", w)
	}
	unknown := map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [][]int{{1}},
		"remote_engine_id": "e_dp0", "remote_request_id": "chatcmpl-nope", "remote_host": "127.0.0.1", "remote_port": 1, "tp_size": 1}
	st, b := postJSON(t, d.URL()+"/v1/chat/completions", with(chat("y"), "kv_transfer_params", unknown, "stream", true), nil)
	events := strings.Split(strings.TrimSpace(string(b)), "\n\n")
	if st != 200 || len(events) != 3 || !strings.Contains(events[0], `"role":"assistant"`) ||
		!strings.Contains(events[1], `"error"`) || events[2] != "data: [DONE]" {
		t.Fatalf("streamed failed read: %d %q", st, events)
	}
	if st, b := postJSON(t, d.URL()+"/v1/completions", map[string]any{"model": "m", "prompt": "a b c", "kv_transfer_params": unknown}, nil); st != 500 ||
		!strings.Contains(string(b), "Internal server error") {
		t.Fatalf("failed read: %d %s", st, b)
	}
	r := Start(Options{Engine: VLLM, Model: "m", PD: &PDOptions{Role: PDDecode, KVLoadFailurePolicy: "recompute"}})
	defer r.Close()
	if st, b := postJSON(t, r.URL()+"/v1/chat/completions", with(chat("z"), "kv_transfer_params", unknown), nil); st != 200 {
		t.Fatalf("recompute: %d %s", st, b)
	}
	if sv := r.Served()[0]; sv.Handoff != HandoffDecodeRecomputed || sv.Computed != sv.PromptTokens {
		t.Fatalf("%+v", sv)
	}
	// Prefill work on /metrics: vllm:prompt_tokens_by_source.
	resp, err := http.Get(r.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(m), fmt.Sprintf(`vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} %d`, r.Served()[0].Computed)) {
		t.Fatalf("metrics:\n%s", m)
	}
}

// A prefill whose blocks were never read frees them after
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT: a late decode fails.
func TestVLLMHeldBlocksExpire(t *testing.T) {
	p := Start(Options{Engine: VLLM, Model: "m", PD: &PDOptions{Role: PDPrefill, KVLeaseDuration: time.Nanosecond}})
	defer p.Close()
	d := Start(Options{Engine: VLLM, Model: "m", PD: &PDOptions{Role: PDDecode}})
	defer d.Close()
	kv := vllmPrefill(t, p, chat("late"))
	if st, b := postJSON(t, d.URL()+"/v1/chat/completions", with(chat("late"), "kv_transfer_params", kv), nil); st != 500 {
		t.Fatalf("%d %s", st, b)
	}
}

func sglangPair(t *testing.T, dp int, po, do PDOptions) (p, d *Server) {
	t.Helper()
	po.Role, do.Role = PDPrefill, PDDecode
	p = Start(Options{Engine: SGLang, Model: "m", DataParallelSize: dp, ReportCachedTokens: true, SGLangFastHealth: true, PD: &po})
	d = Start(Options{Engine: SGLang, Model: "m", DataParallelSize: dp, ReportCachedTokens: true, SGLangFastHealth: true, PD: &do})
	t.Cleanup(func() { p.Close(); d.Close() })
	return p, d
}

// dual sends the prefill and the decode request at once, as SGLang's
// router does.
func dual(t *testing.T, p, d *Server, pbody, dbody map[string]any) (pst, dst int, pb, db []byte) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); pst, pb = postJSON(t, p.URL()+"/v1/chat/completions", pbody, nil) }()
	dst, db = postJSON(t, d.URL()+"/v1/chat/completions", dbody, nil)
	wg.Wait()
	return
}

func bootstrap(p *Server, room uint64) []any {
	u, _ := url.Parse(p.URL())
	return []any{"bootstrap_host", u.Hostname(), "bootstrap_port", p.BootstrapPort(), "bootstrap_room", room}
}

// SGLang's rendezvous: the prefill computes on rank room % dp_size (or the
// routed rank), the decode finds it there by the room alone or by
// disagg_prefill_dp_rank; a room the prefill never saw, or a decode looking
// on the wrong rank, fails with the KV receiver's error once the waiting
// timeout passes, and the prefill's bootstrap times out.
func TestSGLangBootstrapRoom(t *testing.T) {
	p, d := sglangPair(t, 4, PDOptions{BootstrapTimeout: 300 * time.Millisecond}, PDOptions{WaitingTimeout: 300 * time.Millisecond})
	room := rand.Uint64N(1<<63)&^3 | 2 // rank 2
	body := with(chat("rendezvous"), bootstrap(p, room)...)
	pst, dst, pb, db := dual(t, p, d, body, body)
	if pst != 200 || dst != 200 {
		t.Fatalf("prefill %d %s, decode %d %s", pst, pb, dst, db)
	}
	if ps, ds := p.Served()[0], d.Served()[0]; ps.Rank != 2 || ps.Handoff != HandoffPrefill || ds.Handoff != HandoffDecode ||
		ds.Transferred != ds.PromptTokens || ds.Computed != 0 || ds.KVMismatch {
		t.Fatalf("prefill %+v decode %+v", ps, ds)
	}
	// routed_dp_rank on the prefill, disagg_prefill_dp_rank on the decode.
	room = rand.Uint64N(1 << 62)
	pst, dst, pb, db = dual(t, p, d, with(chat("routed"), append(bootstrap(p, room), "routed_dp_rank", 3)...),
		with(chat("routed"), append(bootstrap(p, room), "disagg_prefill_dp_rank", 3, "routed_dp_rank", 1)...))
	if pst != 200 || dst != 200 || p.Served()[1].Rank != 3 || d.Served()[1].Rank != 1 {
		t.Fatalf("prefill %d %s %+v, decode %d %s %+v", pst, pb, p.Served()[1], dst, db, d.Served()[1])
	}
	// The decode looks for the room on another rank than the prefill's.
	room = rand.Uint64N(1<<62) &^ 3
	pst, dst, _, db = dual(t, p, d, with(chat("mismatch"), bootstrap(p, room)...),
		with(chat("mismatch"), append(bootstrap(p, room), "disagg_prefill_dp_rank", 1)...))
	var e map[string]any
	_ = json.Unmarshal(db, &e)
	if dst != 500 || pst != 500 || e["object"] != "error" || e["type"] != "500" ||
		!strings.Contains(fmt.Sprint(e["message"]), fmt.Sprintf("KVTransferError(bootstrap_room=%d)", room)) ||
		!strings.Contains(fmt.Sprint(e["message"]), "timed out") {
		t.Fatalf("mismatched rank: prefill %d, decode %d %s", pst, dst, db)
	}
	// A room no prefill serves, streamed: the error event and [DONE].
	st, b := postJSON(t, d.URL()+"/v1/chat/completions", with(chat("nobody"), append(bootstrap(p, 12345), "stream", true)...), nil)
	events := strings.Split(strings.TrimSpace(string(b)), "\n\n")
	if st != 200 || len(events) != 2 || !strings.Contains(events[0], `"error"`) || !strings.Contains(events[0], "KVTransferError(bootstrap_room=12345)") {
		t.Fatalf("unknown room: %d %q", st, events)
	}
}

// A decode whose prefill server is gone fails at once with the KV
// receiver's "might be dead" error.
func TestSGLangDecodeWithDeadPrefill(t *testing.T) {
	p, d := sglangPair(t, 1, PDOptions{}, PDOptions{})
	body := with(chat("dead"), bootstrap(p, 7)...)
	p.Kill()
	st, b := postJSON(t, d.URL()+"/v1/chat/completions", body, nil)
	if st != 500 || !strings.Contains(string(b), "Failed to get kvcache from prefill instance, it might be dead") {
		t.Fatalf("%d %s", st, b)
	}
}

// vLLM's Messages and Responses APIs carry the NixlConnector handoff as
// chat does: a prefill answers its one token with kv_transfer_params, a
// decode given them reads the blocks (computing only the last prompt
// token) and answers in the API's shape. A release predating the field on
// these APIs drops it: the prefill hands nothing off and the decode
// computes the prompt. An SGLang split server refuses both APIs (no
// bootstrap room reaches its scheduler).
func TestAgentAPIsOnSplitServers(t *testing.T) {
	apis := []struct {
		path, max string
		body      func(msg string) map[string]any
	}{
		{"/v1/messages", "max_tokens", func(msg string) map[string]any {
			return map[string]any{"model": "m", "max_tokens": 5, "system": "sys " + strings.Repeat("x ", 40), "messages": []any{map[string]any{"role": "user", "content": msg}}}
		}},
		{"/v1/responses", "max_output_tokens", func(msg string) map[string]any {
			return map[string]any{"model": "m", "max_output_tokens": 5, "instructions": "sys " + strings.Repeat("x ", 40), "input": msg, "store": false}
		}},
	}
	for _, legacy := range []bool{false, true} {
		p := Start(Options{Engine: VLLM, Model: "m", ReportCachedTokens: true, PD: &PDOptions{Role: PDPrefill, AgentAPIsIgnoreKVTransfer: legacy}})
		defer p.Close()
		d := Start(Options{Engine: VLLM, Model: "m", ReportCachedTokens: true, PD: &PDOptions{Role: PDDecode, AgentAPIsIgnoreKVTransfer: legacy}})
		defer d.Close()
		for _, a := range apis {
			msg := fmt.Sprintf("%s legacy=%v", a.path, legacy)
			st, b := postJSON(t, p.URL()+a.path, with(a.body(msg), "kv_transfer_params", prefillParams, a.max, 1, "stream", false), map[string]string{"X-Request-Id": hexID()})
			var ans map[string]any
			if st != 200 || json.Unmarshal(b, &ans) != nil {
				t.Fatalf("%s prefill: %d %s", msg, st, b)
			}
			kv, handed := ans["kv_transfer_params"].(map[string]any)
			if handed == legacy {
				t.Fatalf("%s prefill: kv_transfer_params %v", msg, ans["kv_transfer_params"])
			}
			decode := a.body(msg)
			if handed {
				decode["kv_transfer_params"] = kv
			}
			st, b = postJSON(t, d.URL()+a.path, decode, nil)
			ans = nil
			if st != 200 || json.Unmarshal(b, &ans) != nil || ans["kv_transfer_params"] != nil {
				t.Fatalf("%s decode: %d %s", msg, st, b)
			}
			sv := d.Served()[len(d.Served())-1]
			want := HandoffDecode
			if legacy {
				want = ""
			}
			if sv.Handoff != want || sv.KVMismatch || (handed && sv.Computed != 1) || (!handed && sv.Computed != sv.PromptTokens) {
				t.Fatalf("%s decode served %+v", msg, sv)
			}
		}
	}
	for _, role := range []PDRole{PDPrefill, PDDecode} {
		s := Start(Options{Engine: SGLang, Model: "m", PD: &PDOptions{Role: role}})
		defer s.Close()
		for _, a := range apis {
			body := with(a.body("sglang"), "bootstrap_host", "127.0.0.1", "bootstrap_port", 8998, "bootstrap_room", 7)
			if st, b := postJSON(t, s.URL()+a.path, body, nil); st/100 != 4 && st/100 != 5 {
				t.Fatalf("SGLang %s server took %s: %d %s", role, a.path, st, b)
			}
		}
		if st, b := postJSON(t, s.URL()+"/v1/messages/count_tokens", map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "hi"}}}, nil); st != 200 {
			t.Fatalf("SGLang %s count_tokens: %d %s", role, st, b)
		}
	}
}
