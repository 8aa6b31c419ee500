package edge

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
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/httpjson"
	"github.com/tether-project/tether/internal/respid"
	"github.com/tether-project/tether/routing/decide"
)

// Stored responses (hard affinity, edge/DESIGN.md "Stored responses"): a
// Responses API response lives in the engine process that produced it, so
// every request naming one goes there. The id the client sees is minted by
// the edge that relayed the response (internal/respid): it names the
// fleet, instance, rank and boot of that process and the engine's own id,
// so any edge routes it with no state and no log lookup.

// Decision labels of a request routed by a stored response.
const (
	outcomeStored = "stored"
	policyStored  = "stored_response"
)

// storedRef is a request's reference to a stored response or a
// conversation: the id the client sent and what it says.
type storedRef struct {
	client string
	id     respid.ID
	url    string
}

// refKind is what a client's id names, and so how a miss is answered.
type refKind int

const (
	refResponse     refKind = iota // a response id in the path
	refPrevious                    // previous_response_id
	refConversation                // a conversation id (path, or the conversation parameter)
)

// notFound is OpenAI's answer to an id it does not hold, with the reason
// tether knows after OpenAI's sentence: previous_response_id 400
// previous_response_not_found ("Previous response with id '…' not
// found."); a response id in the path 404 ("Response with id '…' not
// found.", code response_not_found); a conversation 404 ("Conversation with
// id '…' not found.", no param or code, as OpenAI answers it).
func (k refKind) notFound(client, reason string, args ...any) *api.Error {
	why := fmt.Sprintf(reason, args...)
	id := httpjson.Clip(client, 200)
	switch k {
	case refPrevious:
		return api.NewError(http.StatusBadRequest, "invalid_request_error", "previous_response_not_found", "previous_response_id",
			"Previous response with id '%s' not found. %s", id, why)
	case refConversation:
		return api.NewError(http.StatusNotFound, "invalid_request_error", "", "", "Conversation with id '%s' not found. %s", id, why)
	}
	return api.NewError(http.StatusNotFound, "invalid_request_error", "response_not_found", "response_id", "Response with id '%s' not found. %s", id, why)
}

// noun is what the id names, in messages.
func (k refKind) noun() string {
	if k == refConversation {
		return "conversation"
	}
	return "response"
}

// resolveStored reads a response id a client sent (kind refResponse or
// refPrevious). Any id this cluster did not mint, or that names an
// instance the fleet no longer has (or a process that restarted since), is
// answered in OpenAI's shape: no instance holds it.
func (e *Edge) resolveStored(client string, kind refKind, now time.Time) (*storedRef, *api.Error) {
	count := func(outcome string) { e.metrics.StoredResponses.WithLabelValues(outcome).Inc() }
	id, err := e.respIDs.Parse(client)
	if err == nil {
		if ret := e.cfg.StoredResponseRetention; ret > 0 && now.Sub(id.Minted) > ret {
			count("expired")
			return nil, kind.notFound(client, "It was created at %s, beyond stored_response_retention (%s).", id.Minted.UTC().Format(time.RFC3339), ret)
		}
	}
	return e.resolveRef(client, kind, id, err, now, count)
}

// resolveConversation reads a conversation id a client sent.
func (e *Edge) resolveConversation(client string, now time.Time) (*storedRef, *api.Error) {
	id, err := e.respIDs.ParseConversation(client)
	return e.resolveRef(client, refConversation, id, err, now, func(outcome string) { e.metrics.Conversations.WithLabelValues(outcome).Inc() })
}

// resolveRef finds the instance a parsed id names (err: why it did not
// parse).
func (e *Edge) resolveRef(client string, kind refKind, id respid.ID, err error, now time.Time, count func(outcome string)) (*storedRef, *api.Error) {
	notFound := func(outcome, reason string, args ...any) *api.Error {
		count(outcome)
		return kind.notFound(client, reason, args...)
	}
	switch {
	case errors.Is(err, respid.ErrForged):
		return nil, notFound("forged", "Its id was not issued by this tether cluster (it does not authenticate with the cluster's internal key).")
	case err != nil:
		return nil, notFound("not_minted", "It is not a %s id issued by this tether cluster.", kind.noun())
	}
	in, ok := e.fleet.Instance(id.Instance, now)
	if !ok || in.URL == "" {
		// The log may know the instance while this edge has not heard it
		// yet (just started, or its NATS link is back): that is not a
		// missing response.
		rec, inLog := e.node.State().Instance(id.Instance)
		if (inLog && rec.Status != fsm.InstanceRemoved) || e.ready.InStartupGate(now) {
			count("instance_unheard")
			ae := api.NewError(http.StatusServiceUnavailable, "server_error", "instance_not_heard", "",
				"the %s instance %s holding %s %q has not been heard by this edge yet (it started recently, or lost its telemetry); retry shortly",
				fsm.Fleet(id.Fleet), id.Instance, kind.noun(), httpjson.Clip(client, 200))
			ae.RetryAfter = 500 * time.Millisecond
			return nil, ae
		}
		return nil, notFound("unknown_instance", "The %s instance %s that stored it is not in this fleet.", fsm.Fleet(id.Fleet), id.Instance)
	}
	if in.Fleet != fsm.Fleet(id.Fleet) {
		return nil, notFound("unknown_instance", "%s is not a %s instance.", id.Instance, fsm.Fleet(id.Fleet))
	}
	if id.BootID != 0 && in.BootID != 0 && in.BootID != id.BootID {
		return nil, notFound("restarted", "Instance %s restarted since it stored the %s (boot %x, now %x), and a stored %s lives in the process that made it.",
			id.Instance, kind.noun(), id.BootID, in.BootID, kind.noun())
	}
	count("routed")
	return &storedRef{client: client, id: id, url: in.URL}, nil
}

// pinned is the stored response or conversation rq names (nil none): the
// instance that holds it serves rq.
func (rq *request) pinned() *storedRef {
	if rq.prev != nil {
		return rq.prev
	}
	return rq.conv
}

// storedHop is the hop to the instance holding rq's stored response or
// conversation: no decision, no log, no retry elsewhere (no other instance
// holds it).
func (e *Edge) storedHop(rq *request) *hop {
	ref := rq.pinned()
	f := fsm.Fleet(ref.id.Fleet)
	h := &hop{Hop: decide.Hop{Fleet: f, Key: rq.m.Key(rq.id.Key(f)), Instance: ref.id.Instance, URL: ref.url, Rank: ref.id.Rank,
		Outcome: outcomeStored, Policy: policyStored}}
	e.metrics.Decisions.WithLabelValues(f.String(), policyStored, outcomeStored).Inc()
	return h
}

// prepareResponses reads a Responses request's previous_response_id (the
// engine's own id goes to the engine) and returns the body's conversation
// id as the Responses API ranks them: the conversation parameter, the
// conversation of the previous response, conversation_params.
func (e *Edge) prepareResponses(rq *request, bodyConv string) (string, *api.Error) {
	rf := rq.parsed.Responses
	if rf.PreviousResponseID != "" {
		ref, aerr := e.resolveStored(rf.PreviousResponseID, refPrevious, rq.now)
		if aerr != nil {
			return "", aerr
		}
		rq.prev = ref
		rq.top["previous_response_id"] = api.MustMarshal(ref.id.Upstream)
		if ref.id.Conversation != "" {
			bodyConv = ref.id.Conversation
			rq.continued = bodyConv
		}
	}
	if rf.Conversation != "" {
		// The conversation lives on the instance that holds it, which
		// reads it by its own id.
		ref, aerr := e.resolveConversation(rf.Conversation, rq.now)
		if aerr != nil {
			return "", aerr
		}
		rq.conv = ref
		rq.top["conversation"] = api.MustMarshal(ref.id.Upstream)
		bodyConv, rq.continued = rf.Conversation, ""
	}
	return bodyConv, nil
}

// dispatchStored serves a request that continues a stored response on the
// instance holding it: an aggregated engine gets it as any request; a
// tether worker fleet serves it whole on that (generation) worker, which
// alone can expand previous_response_id into the prompt and holds the
// conversation's KV from the turn it produced.
func (e *Edge) dispatchStored(ctx context.Context, w http.ResponseWriter, rq *request, span trace.Span) int {
	h := e.storedHop(rq)
	if rq.prev != nil {
		span.SetAttributes(attribute.String("tether.stored_response", rq.prev.client))
	} else {
		span.SetAttributes(attribute.String("tether.conversation", rq.conv.client))
	}
	span.SetAttributes(observe.AttrInstance.String(h.Instance))
	if rq.m.Cfg.Aggregated() {
		return e.engineExchange(ctx, w, rq, h, span)
	}
	return e.aggregated(ctx, w, rq, h, span)
}

// minter mints the ids of the responses relayed from hop h (rank: the
// worker's or engine's rank, -1 unknown).
func (e *Edge) minter(rq *request, h *hop, rank string) *responseIDs {
	ids := &responseIDs{known: map[string]string{}}
	if rq.prev != nil {
		ids.known[rq.prev.id.Upstream] = rq.prev.client
	}
	if rq.conv != nil {
		ids.known[rq.conv.id.Upstream] = rq.conv.client
	}
	r, err := strconv.Atoi(rank)
	if err != nil {
		r = -1
	}
	var boot uint64
	if in, ok := e.fleet.Instance(h.Instance, rq.now); ok {
		boot = in.BootID
	}
	ids.mint = func(upstream string) string {
		return e.respIDs.Mint(respid.ID{Fleet: uint8(h.Fleet), Instance: h.Instance, Rank: r, BootID: boot,
			Conversation: rq.id.ConversationID, Upstream: upstream, Edge: e.nodeID, Minted: e.now(), Continued: rq.prev != nil})
	}
	return ids
}

// responseIDs translates between the engine's response ids and the ones
// the client sees, in response objects ("object": "response").
type responseIDs struct {
	known map[string]string // engine id → client id
	mint  func(upstream string) string
}

// Rewrite rewrites the ids of a response object (api.IDs).
func (r *responseIDs) Rewrite(obj map[string]json.RawMessage) bool {
	var object string
	if json.Unmarshal(obj["object"], &object) != nil || object != "response" {
		return false
	}
	changed := false
	var conv struct {
		ID string `json:"id"`
	}
	if raw, ok := obj["conversation"]; ok && json.Unmarshal(raw, &conv) == nil && conv.ID != "" {
		if t, ok := r.known[conv.ID]; ok {
			obj["conversation"] = api.MustMarshal(map[string]string{"id": t})
			changed = true
		}
	}
	for _, k := range []string{"id", "previous_response_id"} {
		var s string
		if json.Unmarshal(obj[k], &s) != nil || s == "" {
			continue
		}
		t, ok := r.known[s]
		if !ok {
			if k != "id" || r.mint == nil {
				continue
			}
			t = r.mint(s)
			r.known[s] = t
		}
		obj[k] = api.MustMarshal(t)
		changed = true
	}
	return changed
}

// Text replaces, in an answer's bytes, every engine id r knows that is
// still there (an error event's message, an item naming it) with the
// client's (r nil: none).
func (r *responseIDs) Text(b []byte) []byte {
	if r == nil {
		return b
	}
	for up, client := range r.known {
		if up != "" && bytes.Contains(b, []byte(up)) {
			b = bytes.ReplaceAll(b, []byte(up), []byte(client))
		}
	}
	return b
}

// handleStoredResponse serves GET and DELETE /v1/responses/{id}, POST
// /v1/responses/{id}/cancel and GET /v1/responses/{id}/input_items (with
// GET's ?stream=true&starting_after=N): each goes to the instance the id
// names, with the engine's own id in the path, and the answer's ids are
// the client's again.
func (e *Edge) handleStoredResponse(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	aw := api.NewWriter(w, apireq.Responses)
	ctx := observe.TraceContext.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := e.tracing.tracer.Start(ctx, "tether.edge /v1/responses/{id}", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("tether.edge", e.nodeID)))
	defer span.End()
	status := e.serveStoredResponse(ctx, aw, r, span)
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	e.metrics.Requests.WithLabelValues("responses_by_id", strconv.Itoa(status)).Inc()
	e.metrics.RequestSeconds.WithLabelValues("responses_by_id").Observe(time.Since(start).Seconds())
	if aw.Aborted() {
		panic(http.ErrAbortHandler)
	}
}

func (e *Edge) serveStoredResponse(ctx context.Context, w http.ResponseWriter, r *http.Request, span trace.Span) int {
	rest := strings.TrimPrefix(r.URL.Path, "/v1/responses/")
	id, action, _ := strings.Cut(rest, "/")
	allowed := map[string]string{"": "GET, DELETE", "cancel": "POST", "input_items": "GET"}[action]
	if allowed == "" || id == "" {
		return api.Fail(w, span, api.NewError(http.StatusNotFound, "invalid_request_error", "unknown_url", "",
			"unknown path %s %s (by id: GET or DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel, GET /v1/responses/{id}/input_items)",
			r.Method, httpjson.Clip(r.URL.Path, 200)))
	}
	if !strings.Contains(allowed, r.Method) || (r.Method == http.MethodHead) {
		w.Header().Set("Allow", allowed)
		return api.Fail(w, span, api.NewError(http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "",
			"method %s is not allowed on %s (allowed: %s)", r.Method, httpjson.Clip(r.URL.Path, 200), allowed))
	}
	if aerr := e.catalogue.ByIDServed(); aerr != nil {
		return api.Fail(w, span, aerr)
	}
	ref, aerr := e.resolveStored(id, refResponse, e.now())
	if aerr != nil {
		return api.Fail(w, span, aerr)
	}
	span.SetAttributes(observe.AttrInstance.String(ref.id.Instance), attribute.String("tether.stored_response", id))
	target := ref.url + "/v1/responses/" + url.PathEscape(ref.id.Upstream)
	if action != "" {
		target += "/" + action
	}
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.UpstreamTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, r.Method, target, nil)
	if err != nil {
		return api.Fail(w, span, api.NewError(http.StatusInternalServerError, "server_error", "internal_error", "", "building the request: %v", err))
	}
	observe.TraceContext.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := e.client.Do(req)
	if err != nil {
		e.metrics.UpstreamErrors.WithLabelValues(fsm.Fleet(ref.id.Fleet).String(), "connect").Inc()
		ae := api.NewError(http.StatusServiceUnavailable, "server_error", "upstream_unavailable", "",
			"the %s instance %s holding response %q is unreachable: %v", fsm.Fleet(ref.id.Fleet), ref.id.Instance, httpjson.Clip(id, 200), err)
		ae.RetryAfter = time.Second
		return api.Fail(w, span, ae)
	}
	defer resp.Body.Close()
	if e.cfg.DebugRouteHeader {
		at := ref.id.Instance + "/" + strconv.Itoa(ref.id.Rank)
		route := "context=" + at + "; generation=-"
		if fsm.Fleet(ref.id.Fleet) == fsm.FleetGeneration {
			route = "context=-; generation=" + at
		}
		w.Header().Set(HeaderRoute, route)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		// The engine names its own id; the client knows the one it sent.
		b = []byte(strings.ReplaceAll(string(b), ref.id.Upstream, id))
		return (&api.UpstreamAnswer{Status: resp.StatusCode, Header: resp.Header, Body: b}).Write(w)
	}
	known := map[string]string{ref.id.Upstream: id}
	if conv, err := respid.DecodeConversation(ref.id.Conversation); err == nil {
		// A response made in a conversation names it by the worker's id.
		known[conv.Upstream] = ref.id.Conversation
	}
	ans := &api.Answer{Dialect: apireq.Responses, Cached: -1, IDs: &responseIDs{known: known}}
	stream := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	return e.answers.Copy(w, resp, ans, stream, fsm.Fleet(ref.id.Fleet), "responses_by_id", ref.id.Instance, span)
}
