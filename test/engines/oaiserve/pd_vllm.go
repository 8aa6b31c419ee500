package oaiserve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"
)

// vLLM's prefill/decode split through the NixlConnector
// (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py, since
// split into nixl/scheduler.py): the proxy sends the prefill server the
// request with
//
//	kv_transfer_params: {do_remote_decode: true, do_remote_prefill: false,
//	  remote_engine_id: null, remote_block_ids: null, remote_host: null,
//	  remote_port: null}
//
// and max_tokens 1 (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py
// send_request_to_service); the prefill's answer carries the
// kv_transfer_params NixlConnectorScheduler.request_finished returns
// (do_remote_prefill true, remote_block_ids, remote_engine_id,
// remote_request_id, remote_host, remote_port, tp_size), which the proxy
// puts into the decode request. The decode pulls the blocks from the
// prefill engine (a ZeroMQ handshake on VLLM_NIXL_SIDE_CHANNEL_HOST:PORT for
// the agent metadata, then NIXL reads, then a notification that frees them)
// and generates.
//
// request_finished keeps the blocks of a prefill that finished
// FINISHED_LENGTH_CAPPED or FINISHED_STOPPED (the model's EOS as its one
// token) for the decode (nixl/pull_scheduler.py and push_scheduler.py
// request_finished), for kv_lease_duration; the proxy sends the decode in
// both cases, with the client's min_tokens (the copy it stripped them from
// was the prefill's). Releases before the lease handed off length-capped
// requests only (PDOptions.LegacyNIXL).
//
// The stand-in keeps a finished prefill's blocks under its request id for
// KVLeaseDuration and serves them on its side channel (an HTTP listener
// here: POST /nixl/read stands for the handshake, the reads and the
// notification in one exchange); remote_host and remote_port name it.

// nixlSideChannelPath is the stand-in's read on the side channel.
const nixlSideChannelPath = "/nixl/read"

// heldKV is a finished prefill's blocks, kept for its decode.
type heldKV struct {
	rank     int
	engineID string
	blockIDs []int
	tokens   []uint32
	expires  time.Time
}

// nixlRead is the decode's read of the held blocks.
type nixlRead struct {
	EngineID  string `json:"engine_id"`
	RequestID string `json:"request_id"`
	BlockIDs  []int  `json:"block_ids"`
}

func (s *Server) registerSideChannel(mux *http.ServeMux) {
	s.pd.engineIDs = make([]string, s.opts.DataParallelSize)
	base := hexID()
	for r := range s.pd.engineIDs {
		// One engine id per engine core (data-parallel rank), as vLLM's
		// KVTransferConfig.engine_id gets a _dp<rank> suffix per core.
		s.pd.engineIDs[r] = fmt.Sprintf("%s_dp%d", base, r)
	}
	mux.HandleFunc("POST "+nixlSideChannelPath, s.serveNIXLRead)
}

// serveNIXLRead hands a held prefill's blocks to its decode once and frees
// them (the decode's notification, NixlConnectorWorker._read_blocks with
// send_notif). An engine id that is not the one holding the request fails
// as NIXL's handshake does ("Remote NIXL agent engine ID mismatch"); a
// request it no longer holds (read already, or freed when its lease ran
// out) fails the read.
func (s *Server) serveNIXLRead(w http.ResponseWriter, r *http.Request) {
	var rd nixlRead
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&rd); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p := s.pd
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ok := p.held[rd.RequestID]
	if ok && time.Now().After(h.expires) {
		delete(p.held, rd.RequestID)
		ok = false
	}
	switch {
	case !ok:
		http.Error(w, fmt.Sprintf("request %s is not held for transfer", rd.RequestID), http.StatusNotFound)
	case h.engineID != rd.EngineID:
		http.Error(w, fmt.Sprintf("Remote NIXL agent engine ID mismatch. Expected %s, received %s.", rd.EngineID, h.engineID), http.StatusConflict)
	case !slices.Equal(h.blockIDs, rd.BlockIDs):
		http.Error(w, fmt.Sprintf("blocks %v are not request %s's %v", rd.BlockIDs, rd.RequestID, h.blockIDs), http.StatusConflict)
	default:
		delete(p.held, rd.RequestID)
		writeJSON(w, http.StatusOK, map[string]any{"token_ids": h.tokens})
	}
}

// vllmHandoff reads the request's kv_transfer_params as the NixlConnector
// does: do_remote_decode makes it a prefill whose blocks are kept,
// do_remote_prefill a decode that reads them.
func (s *Server) vllmHandoff(w http.ResponseWriter, rq pdRequest, top map[string]json.RawMessage, rank int) (*handoff, bool) {
	raw, ok := top["kv_transfer_params"]
	if !ok || isNullJSON(raw) {
		return nil, true
	}
	var params map[string]json.RawMessage
	if err := json.Unmarshal(raw, &params); err != nil {
		// protocol.py: kv_transfer_params: Optional[dict[str, Any]].
		s.badRequest(w, "kv_transfer_params: Input should be a valid dictionary")
		return nil, false
	}
	eos := s.pd.opts.FirstTokenEOS && !minTokensAbove1(top)
	switch {
	case truthy(params["do_remote_prefill"]):
		h, ok := s.vllmDecode(w, rq, rank, params)
		if ok && eos {
			h.finish = "stop"
		}
		return h, ok
	case truthy(params["do_remote_decode"]):
		// vLLM's request id: serving_chat.py "chatcmpl-" + the
		// X-Request-Id header (serving_engine.py _base_request_id), else
		// a random id.
		base := rq.r.Header.Get("X-Request-Id")
		if base == "" {
			base = hexID()
		}
		h := &handoff{kind: HandoffPrefill, reqID: "cmpl-" + base + "-0"}
		switch {
		case rq.agent == agentResponses:
			h.reqID = "resp_" + base // ResponsesRequest.request_id
		case rq.chat || rq.agent == agentMessages:
			h.reqID = "chatcmpl-" + base // Messages run as chat
		}
		if eos {
			h.finish = "stop"
		}
		return h, true
	}
	return nil, true
}

// vllmHoldLocked keeps a finished prefill's blocks for its decode and names
// them in the answer's kv_transfer_params, as request_finished does for a
// request that finished FINISHED_LENGTH_CAPPED or FINISHED_STOPPED
// (nixl/pull_scheduler.py); under LegacyNIXL one the model stopped keeps
// nothing and answers kv_transfer_params null.
func (s *Server) vllmHoldLocked(h *handoff, rank int, tokens []uint32) {
	h.fields = map[string]any{"kv_transfer_params": nil}
	if h.finish == "stop" && s.pd.opts.LegacyNIXL {
		return
	}
	p := s.pd
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for id, k := range p.held {
		if now.After(k.expires) {
			delete(p.held, id)
		}
	}
	bs := s.opts.BlockSize
	n := (len(tokens) + bs - 1) / bs
	ids := make([]int, n)
	for i := range ids {
		ids[i] = p.nextBlock[rank]
		p.nextBlock[rank]++
	}
	p.held[h.reqID] = &heldKV{rank: rank, engineID: p.engineIDs[rank], blockIDs: ids, tokens: slices.Clone(tokens),
		expires: now.Add(p.opts.KVLeaseDuration)}
	u, _ := url.Parse(p.side.URL)
	port, _ := strconv.Atoi(u.Port())
	h.fields["kv_transfer_params"] = map[string]any{
		"do_remote_prefill": true,
		"do_remote_decode":  false,
		// One list per KV cache group (BlockIds): a full-attention
		// model has one.
		"remote_block_ids":  [][]int{ids},
		"remote_engine_id":  p.engineIDs[rank],
		"remote_request_id": h.reqID,
		"remote_host":       u.Hostname(),
		"remote_port":       port,
		"tp_size":           1,
	}
}

// minTokensAbove1 reports whether the request asks for more than one
// token before a stop token may end it (min_tokens; chat's
// min_completion_tokens likewise).
func minTokensAbove1(top map[string]json.RawMessage) bool {
	for _, k := range []string{"min_tokens", "min_completion_tokens"} {
		var n int
		if raw, ok := top[k]; ok && json.Unmarshal(raw, &n) == nil && n > 1 {
			return true
		}
	}
	return false
}

// HeldTransfers is how many finished prefills' blocks this server keeps
// for a decode that has not read them (nor let their lease run out).
func (s *Server) HeldTransfers() int {
	p := s.pd
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, h := range p.held {
		if time.Now().Before(h.expires) {
			n++
		}
	}
	return n
}

// vllmDecode is a decode request. NixlConnectorScheduler.update_state_after_alloc
// reads the remote blocks only when remote_block_ids is set and the params
// hold remote_engine_id, remote_request_id, remote_host and remote_port;
// otherwise it logs "Got invalid KVTransferParams" and the request is
// computed here. A read that fails ends the request with finish_reason
// error under kv_load_failure_policy fail (the default), which the OpenAI
// server turns into its GenerationError (serving_engine.py
// _raise_if_error: "Internal server error", 500; in a stream the error
// event after the role chunk), or computes the prompt here under
// recompute.
func (s *Server) vllmDecode(w http.ResponseWriter, rq pdRequest, rank int, params map[string]json.RawMessage) (*handoff, bool) {
	if hook := s.pd.opts.BeforeHandoff; hook != nil {
		hook()
	}
	var groups [][]int
	if b := params["remote_block_ids"]; !isNullJSON(b) {
		if err := json.Unmarshal(b, &groups); err != nil {
			var flat []int // releases before the hybrid allocator: one list
			if json.Unmarshal(b, &flat) == nil {
				groups = [][]int{flat}
			}
		}
	}
	complete := true
	for _, k := range []string{"remote_engine_id", "remote_request_id", "remote_host", "remote_port"} {
		if _, ok := params[k]; !ok {
			complete = false
		}
	}
	if len(groups) == 0 || len(groups[0]) == 0 || !complete {
		s.warnf("Got invalid KVTransferParams: %s. This request will not utilize KVTransfer", compactParams(params))
		return &handoff{kind: HandoffDecodeInvalidParams}, true
	}
	var engineID, reqID, host string
	var port int
	_ = json.Unmarshal(params["remote_engine_id"], &engineID)
	_ = json.Unmarshal(params["remote_request_id"], &reqID)
	_ = json.Unmarshal(params["remote_host"], &host)
	_ = json.Unmarshal(params["remote_port"], &port)
	got, err := s.readRemote(rq.r.Context(), host, port, nixlRead{EngineID: engineID, RequestID: reqID, BlockIDs: groups[0]})
	if err == nil {
		return &handoff{kind: HandoffDecode, got: true, recv: got}, true
	}
	s.warnf("KV load of request %s from %s:%d failed: %v", reqID, host, port, err)
	if s.pd.opts.KVLoadFailurePolicy == "recompute" {
		return &handoff{kind: HandoffDecodeRecomputed}, true
	}
	s.recordFailed(rq, rank, HandoffDecodeFailed)
	if rq.agent != "" {
		s.agentGenerationError(w, rq)
		return nil, false
	}
	s.vllmGenerationError(w, rq.req, rq.chat)
	return nil, false
}

func (s *Server) readRemote(ctx context.Context, host string, port int, rd nixlRead) ([]uint32, error) {
	b, _ := json.Marshal(rd)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://%s:%d%s", host, port, nixlSideChannelPath), bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.pd.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%d %s", resp.StatusCode, bytes.TrimSpace(body))
	}
	var out struct {
		TokenIDs []uint32 `json:"token_ids"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, err
	}
	return out.TokenIDs, nil
}

// vllmGenerationError answers a request that finished with finish_reason
// error: serving_engine.py _convert_generation_error_to_response (500,
// ErrorResponse InternalServerError "Internal server error"); streamed,
// serving_chat.py chat_completion_stream_generator has sent the role chunk
// on the first output and then yields the error event
// (_convert_generation_error_to_streaming_response) and [DONE].
func (s *Server) vllmGenerationError(w http.ResponseWriter, req request, chat bool) {
	e := s.errorBody(http.StatusInternalServerError, "InternalServerError", "Internal server error")
	if !req.Stream {
		writeJSON(w, http.StatusInternalServerError, e)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	if chat {
		b, _ := json.Marshal(map[string]any{"id": s.eng.requestID(true), "object": "chat.completion.chunk", "created": time.Now().Unix(),
			"model": s.opts.Model, "choices": []any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""},
				"logprobs": nil, "finish_reason": nil}}})
		fmt.Fprintf(bw, "data: %s\n\n", b)
	}
	b, _ := json.Marshal(e)
	fmt.Fprintf(bw, "data: %s\n\ndata: [DONE]\n\n", b)
	_ = bw.Flush()
}

func compactParams(p map[string]json.RawMessage) string {
	b, _ := json.Marshal(p)
	return string(b)
}

func isNullJSON(b json.RawMessage) bool {
	b = bytes.TrimSpace(b)
	return len(b) == 0 || string(b) == "null"
}

// truthy is Python's truth of a JSON value (params.get(key) in an if).
func truthy(b json.RawMessage) bool {
	switch string(bytes.TrimSpace(b)) {
	case "", "null", "false", "0", `""`, "[]", "{}":
		return false
	}
	return true
}
