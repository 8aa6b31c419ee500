package oaiserve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SGLang's prefill/decode split (python/sglang/srt/disaggregation): the
// router (sgl-router src/routers/http/pd_router.rs
// execute_dual_dispatch_internal, bootstrap_injector.rs
// inject_bootstrap_fields) picks a prefill and a decode server and sends
// both the request at once, with bootstrap_host (the prefill's host),
// bootstrap_port (its --disaggregation-bootstrap-port, 8998 by default) and
// a random bootstrap_room in [0, 2^63); the gateway adds routed_dp_rank for
// each server and disagg_prefill_dp_rank for the decode. The decode asks
// the prefill's bootstrap server (an HTTP server on that port) for its
// parallel layout (GET /route), registers its receive buffers for the room
// with the prefill rank's KV sender, and waits for the KV; the prefill
// waits in its bootstrap queue for that registration
// (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT), computes the prompt and pushes
// the KV and its first output token. A prefill server with data
// parallelism places a request on rank room % dp_size unless the request
// names one (--load-balance-method follow_bootstrap_room, the default of a
// prefill server), and a decode that is not told the prefill's rank
// (disagg_prefill_dp_rank) computes it the same way.
//
// The stand-in's bootstrap server answers GET /route and /health as
// upstream's; POST /transfer stands for the registration and the KV push
// (ZeroMQ and RDMA upstream) in one exchange. A decode whose room is not
// there in time fails as the KV receiver does (KVPoll.Failed →
// KVTransferError, finish_reason abort with status 500): the tokenizer
// manager raises HTTPException(500), which serving_base.handle_request
// answers as the flat ErrorResponse; streamed, serving_chat.py yields the
// error event (create_streaming_error_response) and [DONE].

const sglangTransferPath = "/transfer"

type roomKey struct {
	rank int
	room uint64
}

// pdRoom is one bootstrap room: the decode's registration, the prefill's
// KV, the transfer's end.
type pdRoom struct {
	connected, ready, taken, failed chan struct{}
	onceConn, onceReady             sync.Once
	onceTaken, onceFail             sync.Once
	tokens                          []uint32
}

func newRoom() *pdRoom {
	return &pdRoom{connected: make(chan struct{}), ready: make(chan struct{}), taken: make(chan struct{}), failed: make(chan struct{})}
}

func (r *pdRoom) setConnected() { r.onceConn.Do(func() { close(r.connected) }) }
func (r *pdRoom) setTaken()     { r.onceTaken.Do(func() { close(r.taken) }) }
func (r *pdRoom) setFailed()    { r.onceFail.Do(func() { close(r.failed) }) }
func (r *pdRoom) setReady(tokens []uint32) {
	r.onceReady.Do(func() { r.tokens = tokens; close(r.ready) })
}

// room finds or makes the room at (rank, id).
func (p *pdState) room(k roomKey) *pdRoom {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.rooms[k]
	if !ok {
		r = newRoom()
		p.rooms[k] = r
	}
	return r
}

func (p *pdState) dropRoom(k roomKey, r *pdRoom) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rooms[k] == r {
		delete(p.rooms, k)
	}
}

// BootstrapPort is the port of a prefill server's bootstrap server (its
// --disaggregation-bootstrap-port); 0 without one.
func (s *Server) BootstrapPort() int {
	if s.pd == nil || s.opts.Engine != SGLang {
		return 0
	}
	u, _ := url.Parse(s.pd.side.URL)
	port, _ := strconv.Atoi(u.Port())
	return port
}

func (s *Server) registerBootstrap(mux *http.ServeMux) {
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	// disaggregation/common/conn.py CommonKVBootstrapServer._handle_route
	// GET with engine_rank=-1 and target_dp_group=-1: the prefill's
	// parallel layout.
	mux.HandleFunc("GET /route", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"attn_tp_size": 1, "attn_cp_size": 1, "dp_size": s.opts.DataParallelSize,
			"pp_size": 1, "page_size": s.opts.BlockSize, "kv_cache_dtype": "auto", "follow_bootstrap_room": true})
	})
	mux.HandleFunc("POST "+sglangTransferPath, s.serveTransfer)
}

// serveTransfer is a decode's registration for (room, dp_rank) and the KV
// the prefill pushes when it has computed the prompt. It waits as long as
// the decode does (its request's context).
func (s *Server) serveTransfer(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Room   uint64 `json:"room"`
		DPRank int    `json:"dp_rank"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rm := s.pd.room(roomKey{in.DPRank, in.Room})
	rm.setConnected()
	select {
	case <-rm.ready:
		rm.setTaken()
		writeJSON(w, http.StatusOK, map[string]any{"token_ids": rm.tokens})
	case <-rm.failed:
		http.Error(w, "the prefill aborted the request", http.StatusGone)
	case <-r.Context().Done():
	}
}

type bootstrapFields struct {
	host    string
	port    int
	room    uint64
	hasRoom bool
}

func readBootstrap(top map[string]json.RawMessage) bootstrapFields {
	var b bootstrapFields
	_ = json.Unmarshal(top["bootstrap_host"], &b.host)
	_ = json.Unmarshal(top["bootstrap_port"], &b.port)
	if raw, ok := top["bootstrap_room"]; ok && !isNullJSON(raw) {
		b.hasRoom = json.Unmarshal(raw, &b.room) == nil
	}
	return b
}

// bodyRank is the request's routed_dp_rank (or the deprecated
// data_parallel_rank it replaces, io_struct.py normalize_batch_and_arguments).
func bodyRank(top map[string]json.RawMessage, keys ...string) (int, bool) {
	for _, k := range keys {
		if raw, ok := top[k]; ok && !isNullJSON(raw) {
			var v int
			if json.Unmarshal(raw, &v) == nil {
				return v, true
			}
		}
	}
	return 0, false
}

func (s *Server) sglangHandoff(w http.ResponseWriter, rq pdRequest, top map[string]json.RawMessage, rank *int, headerRank bool) (*handoff, bool) {
	b := readBootstrap(top)
	if !headerRank {
		// serving_base.py: the X-Data-Parallel-Rank header wins over
		// the body's routed_dp_rank.
		if v, ok := bodyRank(top, "routed_dp_rank", "data_parallel_rank"); ok {
			if v < 0 || v >= s.opts.DataParallelSize {
				writeJSON(w, http.StatusBadRequest, s.errorBody(http.StatusBadRequest, "BadRequestError",
					fmt.Sprintf("routed_dp_rank=%d out of range [0, %d)", v, s.opts.DataParallelSize)))
				return nil, false
			}
			*rank = v
		} else if s.pd.opts.Role == PDPrefill && b.hasRoom {
			*rank = int(b.room % uint64(s.opts.DataParallelSize)) // follow_bootstrap_room
		}
	}
	if s.pd.opts.Role == PDPrefill {
		return s.sglangPrefill(w, rq, b, *rank)
	}
	return s.sglangDecode(w, rq, top, b, *rank)
}

// sglangPrefill waits in the bootstrap queue until the room's decode has
// registered, then lets the request compute (prefilledLocked hands the KV
// over).
func (s *Server) sglangPrefill(w http.ResponseWriter, rq pdRequest, b bootstrapFields, rank int) (*handoff, bool) {
	k := roomKey{rank, b.room}
	rm := s.pd.room(k)
	t := time.NewTimer(s.pd.opts.BootstrapTimeout)
	defer t.Stop()
	select {
	case <-rm.connected:
		return &handoff{kind: HandoffPrefill, room: rm, oneToken: true}, true
	case <-t.C:
		s.sglangFail(w, rq, rank, HandoffPrefillFailed, fmt.Sprintf("KVTransferError(bootstrap_room=%d): Request %d timed out after %gs in KVPoll.Bootstrapping",
			b.room, b.room, s.pd.opts.BootstrapTimeout.Seconds()))
	case <-rq.r.Context().Done():
		s.recordFailed(rq, rank, HandoffPrefillFailed)
	}
	rm.setFailed()
	s.pd.dropRoom(k, rm)
	return nil, false
}

// sglangAwaitTransfer holds the prefill's answer until its decode took the
// KV (the prefill request finishes once the transfer is done).
func (s *Server) sglangAwaitTransfer(w http.ResponseWriter, h *handoff) bool {
	t := time.NewTimer(s.pd.opts.WaitingTimeout)
	defer t.Stop()
	select {
	case <-h.room.taken:
		return true
	case <-t.C:
		h.room.setFailed()
		writeJSON(w, http.StatusInternalServerError, s.errorBody(http.StatusInternalServerError, "500",
			"Decode instance could be dead: the KV transfer did not complete"))
		return false
	}
}

// sglangDecode reads the prompt's KV for the request's room from the
// prefill's bootstrap server, or fails as the KV receiver does.
func (s *Server) sglangDecode(w http.ResponseWriter, rq pdRequest, top map[string]json.RawMessage, b bootstrapFields, rank int) (*handoff, bool) {
	if hook := s.pd.opts.BeforeHandoff; hook != nil {
		hook()
	}
	addr := net2addr(b.host, b.port)
	fail := func(msg string) (*handoff, bool) {
		s.sglangFail(w, rq, rank, HandoffDecodeFailed, fmt.Sprintf("KVTransferError(bootstrap_room=%d): %s", b.room, msg))
		return nil, false
	}
	dead := "Failed to get kvcache from prefill instance, it might be dead"
	ctx, cancel := context.WithTimeout(rq.r.Context(), s.pd.opts.WaitingTimeout)
	defer cancel()
	prefillRank, ok := bodyRank(top, "disagg_prefill_dp_rank")
	if !ok {
		// disaggregation/common/conn.py try_ensure_parallel_info, then
		// the room's group under follow_bootstrap_room.
		var info struct {
			DPSize int `json:"dp_size"`
		}
		if err := s.bootstrapGet(ctx, addr, "/route?engine_rank=-1&target_dp_group=-1&target_pp_rank=-1", &info); err != nil || info.DPSize < 1 {
			return fail(dead)
		}
		prefillRank = int(b.room % uint64(info.DPSize))
	}
	body, _ := json.Marshal(map[string]any{"room": b.room, "dp_rank": prefillRank})
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+sglangTransferPath, bytes.NewReader(body))
	if err != nil {
		return fail(dead)
	}
	resp, err := s.pd.client.Do(hreq)
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fail(fmt.Sprintf("Request %d timed out after %gs in KVPoll.WaitingForInput", b.room, s.pd.opts.WaitingTimeout.Seconds()))
	case err != nil:
		if rq.r.Context().Err() != nil {
			s.recordFailed(rq, rank, HandoffDecodeFailed)
			return nil, false
		}
		return fail(dead)
	}
	defer resp.Body.Close()
	var out struct {
		TokenIDs []uint32 `json:"token_ids"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&out) != nil {
		return fail(dead)
	}
	return &handoff{kind: HandoffDecode, got: true, recv: out.TokenIDs}, true
}

func (s *Server) bootstrapGet(ctx context.Context, addr, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return err
	}
	resp, err := s.pd.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %d", path, resp.StatusCode)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(v)
}

// net2addr is the bootstrap address the decode dials
// (f"{bootstrap_host}:{bootstrap_port}"; a missing host or port reaches
// nothing).
func net2addr(host string, port int) string {
	if host == "" {
		host = "None"
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port == 0 {
		return host + ":None"
	}
	return host + ":" + strconv.Itoa(port)
}

// sglangFail answers a request the scheduler aborted with status 500.
func (s *Server) sglangFail(w http.ResponseWriter, rq pdRequest, rank int, kind, msg string) {
	s.recordFailed(rq, rank, kind)
	if !rq.req.Stream {
		writeJSON(w, http.StatusInternalServerError, s.errorBody(http.StatusInternalServerError, "500", msg))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	b, _ := json.Marshal(map[string]any{"error": s.errorBody(http.StatusInternalServerError, "INTERNAL_SERVER_ERROR", msg)})
	fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", b)
}
