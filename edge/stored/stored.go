// Package stored is hard affinity by self-routing ids: a stored Responses
// response and a conversation of the Conversations API live in the worker
// or engine process that made them, and every request naming one must
// reach that process from any edge. The edge that relays a response (or
// creates a conversation) mints the id the client sees (internal/respid:
// the fleet, instance, rank and boot of the process, the engine's own id,
// under a MAC), so any edge routes a request naming it with no state and
// no log lookup; answers name the client's ids, never the engine's. It
// resolves ids (answered in OpenAI's shape when no instance holds them),
// mints them on relayed answers, and serves GET/DELETE
// /v1/responses/{id} & co. and /v1/conversations & co. See edge/DESIGN.md
// "Stored responses" and "Conversations".
package stored

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/catalog"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/bodybudget"
	"github.com/tether-project/tether/internal/httpjson"
	"github.com/tether-project/tether/internal/respid"
)

// Ref is a request's reference to a stored response or a conversation:
// the id the client sent and what it says, and the URL of the instance
// that holds it.
type Ref struct {
	Client string
	ID     respid.ID
	URL    string
}

// target is the URL at the instance holding ref of the path below
// collection that the client named by its id: the engine's (or worker's)
// own id in its place, then /sub and ?query when given.
func (ref *Ref) target(collection, sub, query string) string {
	t := ref.URL + collection + url.PathEscape(ref.ID.Upstream)
	if sub != "" {
		t += "/" + sub
	}
	if query != "" {
		t += "?" + query
	}
	return t
}

// Kind is what a client's id names, and so how a miss is answered.
type Kind int

const (
	Response     Kind = iota // a response id in the path
	Previous                 // previous_response_id
	Conversation             // a conversation id (path, or the conversation parameter)
)

// Service resolves the ids of stored responses and conversations, mints
// them on the answers it relays, and serves the endpoints that name them
// (GET/DELETE /v1/responses/{id} & co., /v1/conversations & co.).
type Service struct {
	edge Edge
	cfg  Config
}

// Edge is what the service asks of the edge, per request.
type Edge interface {
	// Fleet is the edge's view of the workers: where an id's instance is.
	Fleet() *fleetview.View
	// Unheard reports whether instance, which the fleet view does not
	// have, may still exist: the log records it, or the edge has just
	// started and may not have heard every instance yet.
	Unheard(instance string, now time.Time) bool
	// PlaceConversation places a new conversation of model m as an
	// unkeyed request is placed on its generation fleet: the instance and
	// its URL.
	PlaceConversation(ctx context.Context, m *catalog.Model) (instance, url string, aerr *api.Error)
}

// Config is what the service takes from the edge.
type Config struct {
	// NodeID names this edge in the ids it mints.
	NodeID string
	// Codec mints and reads the ids (the internal key's).
	Codec *respid.Codec
	// Retention is stored_response_retention (0: no limit).
	Retention time.Duration
	// UpstreamTimeout bounds one request to the instance holding an id.
	UpstreamTimeout time.Duration
	// DebugRouteHeader: answers carry x-tether-route.
	DebugRouteHeader bool
	// Catalogue is the edge's models: the one a new conversation names.
	Catalogue *catalog.Catalogue
	// Bodies and MaxBodyBytes bound the request bodies held
	// (max_inflight_body_bytes, max_body_bytes).
	Bodies       *bodybudget.Budget
	MaxBodyBytes int64
	Client       *http.Client
	Answers      api.Relayer
	Metrics      *observe.Metrics
	// Served traces and counts the service's endpoints.
	Served api.Served
	// Now is the edge's clock.
	Now func() time.Time
}

// New is the service over edge.
func New(edge Edge, cfg Config) *Service { return &Service{edge: edge, cfg: cfg} }

// NotFound is OpenAI's answer to an id it does not hold, with the reason
// tether knows after OpenAI's sentence: previous_response_id 400
// previous_response_not_found ("Previous response with id '…' not
// found."); a response id in the path 404 ("Response with id '…' not
// found.", code response_not_found); a conversation 404 ("Conversation with
// id '…' not found.", no param or code, as OpenAI answers it).
func (k Kind) NotFound(client, reason string, args ...any) *api.Error {
	why := fmt.Sprintf(reason, args...)
	id := httpjson.Clip(client, 200)
	switch k {
	case Previous:
		return api.NewError(http.StatusBadRequest, "invalid_request_error", "previous_response_not_found", "previous_response_id",
			"Previous response with id '%s' not found. %s", id, why)
	case Conversation:
		return api.NewError(http.StatusNotFound, "invalid_request_error", "", "", "Conversation with id '%s' not found. %s", id, why)
	}
	return api.NewError(http.StatusNotFound, "invalid_request_error", "response_not_found", "response_id", "Response with id '%s' not found. %s", id, why)
}

// Unreachable is the answer to a request naming ref (as kind) when the
// instance holding it cannot be reached (err: the hop's failure): 503
// with Retry-After, naming the id the client sent, never the instance's
// URL or its own id for the object. The instance may be restarting (then
// the id will be answered not found) or cut off for a moment; no other
// instance holds the object, so nothing is retried elsewhere.
func (ref *Ref) Unreachable(kind Kind, err error) *api.Error {
	param := map[Kind]string{Previous: "previous_response_id"}[kind]
	ae := api.NewError(http.StatusServiceUnavailable, "server_error", "upstream_unavailable", param,
		"The %s instance %s holding %s '%s' is unreachable (%s); retry shortly: while it is down no other instance can serve it.",
		fsm.Fleet(ref.ID.Fleet), ref.ID.Instance, kind.noun(), httpjson.Clip(ref.Client, 200), HopFailure(err))
	ae.RetryAfter = time.Second
	return ae
}

// Unreachable is Ref.Unreachable for the object a Responses request
// continues (its previous response, else its conversation).
func (p Prepared) Unreachable(err error) *api.Error {
	if p.Prev != nil {
		return p.Prev.Unreachable(Previous, err)
	}
	return p.Conv.Unreachable(Conversation, err)
}

// HopFailure is why a request to an instance failed, without the request's
// URL (which names the instance's address and its own ids): the failed
// operation and the system's reason ("dial: connect: connection refused",
// "context deadline exceeded").
func HopFailure(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Op + ": " + op.Err.Error()
	}
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		return ue.Err.Error()
	}
	return err.Error()
}

// noun is what the id names, in messages.
func (k Kind) noun() string {
	if k == Conversation {
		return "conversation"
	}
	return "response"
}

// Resolve reads a response id a client sent (kind Response or
// Previous). Any id this cluster did not mint, or that names an
// instance the fleet no longer has (or a process that restarted since), is
// answered in OpenAI's shape: no instance holds it.
func (e *Service) Resolve(client string, kind Kind, now time.Time) (*Ref, *api.Error) {
	count := func(outcome string) { e.cfg.Metrics.StoredResponses.WithLabelValues(outcome).Inc() }
	id, err := e.cfg.Codec.Parse(client)
	if err == nil {
		if ret := e.cfg.Retention; ret > 0 && now.Sub(id.Minted) > ret {
			count("expired")
			return nil, kind.NotFound(client, "It was created at %s, beyond stored_response_retention (%s).", id.Minted.UTC().Format(time.RFC3339), ret)
		}
	}
	return e.resolveRef(client, kind, id, err, now, count)
}

// ResolveConversation reads a conversation id a client sent.
func (e *Service) ResolveConversation(client string, now time.Time) (*Ref, *api.Error) {
	id, err := e.cfg.Codec.ParseConversation(client)
	return e.resolveRef(client, Conversation, id, err, now, func(outcome string) { e.cfg.Metrics.Conversations.WithLabelValues(outcome).Inc() })
}

// resolveRef finds the instance a parsed id names (err: why it did not
// parse).
func (e *Service) resolveRef(client string, kind Kind, id respid.ID, err error, now time.Time, count func(outcome string)) (*Ref, *api.Error) {
	notFound := func(outcome, reason string, args ...any) *api.Error {
		count(outcome)
		return kind.NotFound(client, reason, args...)
	}
	switch {
	case errors.Is(err, respid.ErrForged):
		return nil, notFound("forged", "Its id was not issued by this tether cluster (it does not authenticate with the cluster's internal key).")
	case err != nil:
		return nil, notFound("not_minted", "It is not a %s id issued by this tether cluster.", kind.noun())
	}
	in, ok := e.edge.Fleet().Instance(id.Instance, now)
	if !ok || in.URL == "" {
		// The log may know the instance while this edge has not heard it
		// yet (just started, or its NATS link is back): that is not a
		// missing response.
		if e.edge.Unheard(id.Instance, now) {
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
	return &Ref{Client: client, ID: id, URL: in.URL}, nil
}

// Prepared is what a Responses request names: the stored response it
// continues (Prev: its previous_response_id) and the conversation it
// names (Conv: its conversation parameter), and the conversation it
// continues when that is the previous response's (Continued).
type Prepared struct {
	Prev, Conv *Ref
	Continued  string
}

// Prepare reads a Responses request's previous_response_id and
// conversation parameter (rf; the engine's own ids go to the engine in
// top) and returns the body's conversation id as the Responses API ranks
// them: the conversation parameter, the conversation of the previous
// response, bodyConv (conversation_params).
func (e *Service) Prepare(rf *apireq.ResponsesFields, top map[string]json.RawMessage, bodyConv string, now time.Time) (Prepared, string, *api.Error) {
	var p Prepared
	if rf.PreviousResponseID != "" {
		ref, aerr := e.Resolve(rf.PreviousResponseID, Previous, now)
		if aerr != nil {
			return p, "", aerr
		}
		p.Prev = ref
		top["previous_response_id"] = api.MustMarshal(ref.ID.Upstream)
		if ref.ID.Conversation != "" {
			bodyConv = ref.ID.Conversation
			p.Continued = bodyConv
		}
	}
	if rf.Conversation != "" {
		// The conversation lives on the instance that holds it, which
		// reads it by its own id.
		ref, aerr := e.ResolveConversation(rf.Conversation, now)
		if aerr != nil {
			return p, "", aerr
		}
		p.Conv = ref
		top["conversation"] = api.MustMarshal(ref.ID.Upstream)
		bodyConv, p.Continued = rf.Conversation, ""
	}
	return p, bodyConv, nil
}

// Holder is where a relayed response is held: the instance of a fleet,
// and the worker's or engine's rank ("": unknown).
type Holder struct {
	Fleet    fsm.Fleet
	Instance string
	Rank     string
}

// Minter mints the ids of the responses relayed from h, for a request in
// conversation conv naming p's stored response and conversation (now: the
// request's time).
func (e *Service) Minter(p Prepared, h Holder, conv string, now time.Time) *IDs {
	ids := &IDs{known: map[string]string{}}
	if p.Prev != nil {
		ids.known[p.Prev.ID.Upstream] = p.Prev.Client
	}
	if p.Conv != nil {
		ids.known[p.Conv.ID.Upstream] = p.Conv.Client
	}
	r, err := strconv.Atoi(h.Rank)
	if err != nil {
		r = -1
	}
	var boot uint64
	if in, ok := e.edge.Fleet().Instance(h.Instance, now); ok {
		boot = in.BootID
	}
	ids.mint = func(upstream string) string {
		return e.cfg.Codec.Mint(respid.ID{Fleet: uint8(h.Fleet), Instance: h.Instance, Rank: r, BootID: boot,
			Conversation: conv, Upstream: upstream, Edge: e.cfg.NodeID, Minted: e.cfg.Now(), Continued: p.Prev != nil})
	}
	return ids
}

// IDs translates between the engine's response ids and the ones
// the client sees, in response objects ("object": "response").
type IDs struct {
	known map[string]string // engine id → client id
	mint  func(upstream string) string
}

// Rewrite rewrites the ids of a response object (api.IDs).
func (r *IDs) Rewrite(obj map[string]json.RawMessage) bool {
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
func (r *IDs) Text(b []byte) []byte {
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

// ServeByID serves GET and DELETE /v1/responses/{id}, POST
// /v1/responses/{id}/cancel and GET /v1/responses/{id}/input_items (with
// GET's ?stream=true&starting_after=N): each goes to the instance the id
// names, with the engine's own id in the path, and the answer's ids are
// the client's again.
func (e *Service) ServeByID(w http.ResponseWriter, r *http.Request) {
	e.cfg.Served.Serve(w, r, api.Endpoint{Label: "responses_by_id", Span: "tether.edge /v1/responses/{id}", Dialect: apireq.Responses},
		func(ctx context.Context, w http.ResponseWriter, span trace.Span) int {
			return e.serveByID(ctx, w, r, span)
		})
}

func (e *Service) serveByID(ctx context.Context, w http.ResponseWriter, r *http.Request, span trace.Span) int {
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
	if aerr := e.cfg.Catalogue.ByIDServed(); aerr != nil {
		return api.Fail(w, span, aerr)
	}
	ref, aerr := e.Resolve(id, Response, e.cfg.Now())
	if aerr != nil {
		return api.Fail(w, span, aerr)
	}
	span.SetAttributes(observe.AttrInstance.String(ref.ID.Instance), attribute.String("tether.stored_response", id))
	target := ref.target("/v1/responses/", action, r.URL.RawQuery)
	ctx, cancel := context.WithTimeout(ctx, e.cfg.UpstreamTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, r.Method, target, nil)
	if err != nil {
		return api.Fail(w, span, api.NewError(http.StatusInternalServerError, "server_error", "internal_error", "", "building the request: %v", err))
	}
	observe.TraceContext.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := e.cfg.Client.Do(req)
	if err != nil {
		e.cfg.Metrics.UpstreamErrors.WithLabelValues(fsm.Fleet(ref.ID.Fleet).String(), "connect").Inc()
		return api.Fail(w, span, ref.Unreachable(Response, err))
	}
	defer resp.Body.Close()
	if e.cfg.DebugRouteHeader {
		at := ref.ID.Instance + "/" + strconv.Itoa(ref.ID.Rank)
		route := "context=" + at + "; generation=-"
		if fsm.Fleet(ref.ID.Fleet) == fsm.FleetGeneration {
			route = "context=-; generation=" + at
		}
		w.Header().Set(api.HeaderRoute, route)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		// The engine names its own id; the client knows the one it sent.
		b = []byte(strings.ReplaceAll(string(b), ref.ID.Upstream, id))
		return (&api.UpstreamAnswer{Status: resp.StatusCode, Header: resp.Header, Body: b}).Write(w)
	}
	known := map[string]string{ref.ID.Upstream: id}
	if conv, err := respid.DecodeConversation(ref.ID.Conversation); err == nil {
		// A response made in a conversation names it by the worker's id.
		known[conv.Upstream] = ref.ID.Conversation
	}
	ans := &api.Answer{Dialect: apireq.Responses, Cached: -1, IDs: &IDs{known: known}}
	stream := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	return e.cfg.Answers.Copy(w, resp, ans, stream, fsm.Fleet(ref.ID.Fleet), "responses_by_id", ref.ID.Instance, span)
}

// ClientAnswer is a worker's (or engine's) answer other than 200 to a
// request naming p's stored response and conversation, as the client reads
// it: the ids it names are the ones the client sent, never
// the engine's own (a stored response's, a conversation's), and an
// engine's 404 for the previous_response_id (vLLM's answer: its store no
// longer holds it) is OpenAI's 400 previous_response_not_found.
func ClientAnswer(p Prepared, status int, header http.Header, b []byte) *api.UpstreamAnswer {
	for _, ref := range []*Ref{p.Prev, p.Conv} {
		if ref != nil {
			b = bytes.ReplaceAll(b, []byte(ref.ID.Upstream), []byte(ref.Client))
		}
	}
	if p.Prev != nil && status == http.StatusNotFound && bytes.Contains(b, []byte(p.Prev.Client)) {
		aerr := Previous.NotFound(p.Prev.Client, "The %s instance %s that stored it no longer holds it (evicted, deleted, or its engine restarted).",
			fsm.Fleet(p.Prev.ID.Fleet), p.Prev.ID.Instance)
		h := header.Clone()
		h.Set("Content-Type", "application/json")
		return &api.UpstreamAnswer{Status: aerr.Status, Header: h, Body: aerr.JSON(apireq.Responses)}
	}
	return &api.UpstreamAnswer{Status: status, Header: header, Body: b}
}
