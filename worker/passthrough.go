package worker

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/worker/adp"
	"github.com/tether-project/tether/worker/proxy"
)

// A proxy worker in front of engines that serve the Messages and Responses
// APIs themselves (vLLM, SGLang) relays those requests untouched to the
// upstream of the rank the scheduler picks, and their answers untouched to
// the edge. A stored response lives in the upstream that made it: the
// worker remembers which rank relayed each response id (bounded by
// responses_store_entries, least recently used forgotten first), so a
// request naming one (previous_response_id, or by id) goes to that rank.

// respRanks maps the engines' response ids to the rank that holds them.
type respRanks struct {
	mu    sync.Mutex
	ranks *lruMap[int]
}

func newRespRanks(max int) *respRanks {
	return &respRanks{ranks: newLRUMap[int](max, 0)}
}

func (m *respRanks) put(id string, rank int) {
	if id == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ranks.put(id, rank, 0)
	m.ranks.evict(0, nil)
}

func (m *respRanks) get(id string) (int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ranks.get(id)
}

// passThrough relays x's Messages or Responses request to px's upstream.
func (x *exchange) passThrough(px *proxy.Engine) (int, string) {
	s, p := x.s, x.p
	rank := -1
	body := p.sanitizedBody
	var tap *convTap
	if rf := p.req.Responses; rf != nil && rf.PreviousResponseID != "" {
		r, ok := s.respRanks.get(rf.PreviousResponseID)
		if !ok {
			return x.fail(previousNotFound(rf.PreviousResponseID)), ""
		}
		rank = r
	} else if rf != nil && rf.Conversation != "" {
		var aerr *apiError
		if body, tap, aerr = s.expandConversation(p); aerr != nil {
			return x.fail(aerr), ""
		}
	}
	placeReq := adp.Request{ConversationID: p.conversationID, AffinityID: x.affinity, PromptTokens: len(p.prompt)}
	if placeReq.ConversationID == "" && placeReq.AffinityID == "" && p.dialect.HasConversation() {
		placeReq.Prompt = p.prompt // a prompt continuing a recent one follows its rank
	}
	d := s.sched.Place(placeReq)
	defer func() {
		s.sched.Finish(&d.Ticket)
		s.nudgeTelemetry()
	}()
	if rank < 0 {
		rank = d.Rank
	}
	s.sched.Start(&d.Ticket)
	hdr := http.Header{"Content-Type": {"application/json"}}
	for _, k := range []string{"Anthropic-Version", "Anthropic-Beta"} {
		if v := x.r.Header.Values(k); len(v) > 0 {
			hdr[k] = v
		}
	}
	x.w.Header().Set(HeaderADPRank, strconv.Itoa(rank))
	x.w.Header().Set(HeaderInstance, s.cfg.InstanceID)
	status := s.relayUpstream(x.w, x.r, px, rank, http.MethodPost, x.r.URL.Path, body, hdr, x.dialect, tap)
	return status, "aggregated"
}

// convTap follows a relayed Responses answer for the conversation the
// request named: every response object gets the conversation's id, and
// the finished response's input and output items join the conversation.
type convTap struct {
	s     *Server
	conv  string
	input []json.RawMessage
	done  bool
}

// expandConversation is the body the engine gets for a request naming a
// conversation (vLLM and SGLang have no Conversations API): the
// conversation's items, then the request's input, as its input; no
// conversation field.
func (s *Server) expandConversation(p *parsedRequest) ([]byte, *convTap, *apiError) {
	rf := p.req.Responses
	c, ok := s.conversations.get(rf.Conversation)
	if !ok {
		return nil, nil, convNotFound(rf.Conversation)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(p.sanitizedBody, &top); err != nil {
		return nil, nil, newAPIError(http.StatusInternalServerError, "server_error", "", "", "re-reading the request: %v", err)
	}
	tap := &convTap{s: s, conv: rf.Conversation, input: inputItems(rf.Input)}
	delete(top, "conversation")
	top["input"], _ = json.Marshal(append(append([]json.RawMessage(nil), c.items...), tap.input...))
	body, err := json.Marshal(top)
	if err != nil {
		return nil, nil, newAPIError(http.StatusInternalServerError, "server_error", "", "", "re-encoding the request: %v", err)
	}
	return body, tap, nil
}

// object rewrites one response object of the answer (ok false: leave the
// bytes as they are).
func (t *convTap) object(resp map[string]json.RawMessage) bool {
	resp["conversation"], _ = json.Marshal(map[string]string{"id": t.conv})
	var status string
	_ = json.Unmarshal(resp["status"], &status)
	if !t.done && (status == "completed" || status == "incomplete") {
		t.done = true
		var output []json.RawMessage
		_ = json.Unmarshal(resp["output"], &output)
		t.s.conversations.appendItems(t.conv, append(t.input, output...))
	}
	return true
}

// rewrite passes one JSON answer (or one event's data) through t: a
// response object, or an event carrying one.
func (t *convTap) rewrite(b []byte) []byte {
	var top map[string]json.RawMessage
	if json.Unmarshal(b, &top) != nil {
		return b
	}
	var object string
	_ = json.Unmarshal(top["object"], &object)
	if object == "response" {
		t.object(top)
	} else if raw, ok := top["response"]; ok {
		var resp map[string]json.RawMessage
		if json.Unmarshal(raw, &resp) != nil || !t.object(resp) {
			return b
		}
		top["response"], _ = json.Marshal(resp)
	} else {
		return b
	}
	out, err := json.Marshal(top)
	if err != nil {
		return b
	}
	return out
}

// relayUpstream sends one request to rank's upstream and copies the answer
// to w as it comes, learning the response ids it carries.
func (s *Server) relayUpstream(w http.ResponseWriter, r *http.Request, px *proxy.Engine, rank int, method, path string, body []byte, hdr http.Header, d apireq.Dialect, tap *convTap) int {
	target := px.Upstream(rank) + path
	if r.URL.RawQuery != "" && method == http.MethodGet {
		target += "?" + r.URL.RawQuery
	}
	req, err := http.NewRequestWithContext(r.Context(), method, target, bytes.NewReader(body))
	if err != nil {
		e := newAPIError(http.StatusInternalServerError, "server_error", "internal_error", "", "building the upstream request: %v", err)
		e.Write(w, d)
		return e.Status
	}
	req.Header = hdr
	propagation.TraceContext{}.Inject(r.Context(), propagation.HeaderCarrier(req.Header))
	resp, err := px.Client().Do(req)
	if err != nil {
		e := newAPIError(http.StatusBadGateway, "upstream_error", "upstream_unavailable", "", "rank %d upstream %s: %v", rank, px.Upstream(rank), err)
		e.Write(w, d)
		return e.Status
	}
	defer resp.Body.Close()
	ct := resp.Header.Get("Content-Type")
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(resp.StatusCode)
	rl := &upstreamRelay{s: s, w: w, rc: http.NewResponseController(w), rank: rank, tap: tap}
	br := bufio.NewReaderSize(resp.Body, 32<<10)
	if len(ct) >= 17 && ct[:17] == "text/event-stream" {
		return rl.stream(br, resp.StatusCode)
	}
	return rl.whole(br, resp.StatusCode)
}

// upstreamRelay copies one upstream answer to the client, learning the response
// ids it carries (their rank) and rewriting them for a conversation (tap).
type upstreamRelay struct {
	s    *Server
	w    http.ResponseWriter
	rc   *http.ResponseController
	rank int
	tap  *convTap
}

// learn records the rank of the response id an answer or event carries.
func (rl *upstreamRelay) learn(b []byte) {
	var v struct {
		Object   string `json:"object"`
		ID       string `json:"id"`
		Response *struct {
			ID string `json:"id"`
		} `json:"response"`
	}
	if json.Unmarshal(b, &v) != nil {
		return
	}
	if v.Object == "response" {
		rl.s.respRanks.put(v.ID, rl.rank)
	} else if v.Response != nil {
		rl.s.respRanks.put(v.Response.ID, rl.rank)
	}
}

// whole relays an answer that is not a stream.
func (rl *upstreamRelay) whole(br *bufio.Reader, status int) int {
	b, err := io.ReadAll(io.LimitReader(br, 64<<20))
	if err == nil && status == http.StatusOK {
		rl.learn(b)
		if rl.tap != nil {
			b = rl.tap.rewrite(b)
		}
	}
	_ = rl.rc.SetWriteDeadline(time.Now().Add(rl.s.cfg.WriteTimeout))
	_, _ = rl.w.Write(b)
	if err != nil {
		panic(http.ErrAbortHandler) // a cut answer must not read as whole
	}
	return status
}

// stream relays a server-sent event stream line by line, flushing at the
// end of each event.
func (rl *upstreamRelay) stream(br *bufio.Reader, status int) int {
	for {
		line, err := br.ReadBytes('\n')
		if data, ok := bytes.CutPrefix(line, []byte("data: ")); ok && bytes.Contains(data, []byte(`"response":{`)) {
			rl.learn(data)
			if rl.tap != nil {
				line = append(append([]byte("data: "), rl.tap.rewrite(bytes.TrimRight(data, "\r\n"))...), '\n')
			}
		}
		if len(line) > 0 {
			_ = rl.rc.SetWriteDeadline(time.Now().Add(rl.s.cfg.WriteTimeout))
			if _, werr := rl.w.Write(line); werr != nil {
				return statusClientClosed
			}
			if len(bytes.TrimSpace(line)) == 0 && rl.rc.Flush() != nil {
				return statusClientClosed
			}
		}
		if err == io.EOF {
			_ = rl.rc.Flush()
			return status
		}
		if err != nil {
			// The upstream broke off: so does this answer (the edge sees
			// the cut and tells its client).
			panic(http.ErrAbortHandler)
		}
	}
}

// relayStored relays a by-id request (GET/DELETE /v1/responses/{id},
// .../cancel, .../input_items) to the rank whose upstream holds id.
func (s *Server) relayStored(w http.ResponseWriter, r *http.Request, px *proxy.Engine, id, action string) {
	rank, ok := s.respRanks.get(id)
	if !ok {
		s.metrics.requests.WithLabelValues("responses_by_id", "404").Inc()
		writeAPIError(w, notFoundResponse(id, "response_id"))
		return
	}
	path := "/v1/responses/" + url.PathEscape(id)
	if action != "" {
		path += "/" + action
	}
	w.Header().Set(HeaderADPRank, strconv.Itoa(rank))
	w.Header().Set(HeaderInstance, s.cfg.InstanceID)
	status := s.relayUpstream(w, r, px, rank, r.Method, path, nil, http.Header{}, apireq.Responses, nil)
	s.metrics.requests.WithLabelValues("responses_by_id", strconv.Itoa(status)).Inc()
}
