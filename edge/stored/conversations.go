package stored

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/observe"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/httpjson"
	"github.com/tether-project/tether/internal/respid"
)

// Conversations (edge/DESIGN.md "Conversations"): a conversation of the
// Conversations API lives in the worker process that holds it, as a stored
// response does, and its id is minted by the edge that created it
// (respid.MintConversation: conv_t1…), naming the instance, so every edge
// routes a request naming it there with no state and no log lookup. A new
// conversation goes to the fleet that serves whole Responses requests on
// a tether worker fleet, the generation fleet (a request naming the
// conversation runs there whole, as a continuation of a stored response
// does: dispatchStored), placed as an unkeyed request is (no binding, no
// commit).

// ServeConversations serves /v1/conversations and below.
func (e *Service) ServeConversations(w http.ResponseWriter, r *http.Request) {
	e.cfg.Served.Serve(w, r, api.Endpoint{Label: "conversations", Span: "tether.edge /v1/conversations", Dialect: apireq.Responses},
		func(ctx context.Context, w http.ResponseWriter, span trace.Span) int {
			return e.serveConversations(ctx, w, r, span)
		})
}

// conversationMethods are the methods of each path under a conversation
// ("" the conversation, "items", "items/{item_id}").
func conversationMethods(sub string) string {
	switch {
	case sub == "":
		return "GET, POST, DELETE"
	case sub == "items":
		return "GET, POST"
	case strings.HasPrefix(sub, "items/") && len(sub) > len("items/") && !strings.Contains(sub[len("items/"):], "/"):
		return "GET, DELETE"
	}
	return ""
}

func (e *Service) serveConversations(ctx context.Context, w http.ResponseWriter, r *http.Request, span trace.Span) int {
	rest := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/v1/conversations"), "/")
	id, sub, _ := strings.Cut(rest, "/")
	allowed := "POST"
	if rest != "" {
		allowed = conversationMethods(sub)
	}
	if allowed == "" || (rest != "" && id == "") {
		return api.Fail(w, span, api.NewError(http.StatusNotFound, "invalid_request_error", "unknown_url", "",
			"unknown path %s %s (conversations: POST /v1/conversations; GET, POST or DELETE /v1/conversations/{id}; GET or POST .../items; GET or DELETE .../items/{item_id})",
			r.Method, httpjson.Clip(r.URL.Path, 200)))
	}
	if !strings.Contains(allowed, r.Method) || r.Method == http.MethodHead {
		w.Header().Set("Allow", allowed)
		return api.Fail(w, span, api.NewError(http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "",
			"method %s is not allowed on %s (allowed: %s)", r.Method, httpjson.Clip(r.URL.Path, 200), allowed))
	}
	var body []byte
	if r.Method == http.MethodPost {
		b, release, aerr := api.ReadBody(r, e.cfg.Bodies, e.cfg.MaxBodyBytes, e.cfg.Metrics.BodyRefused)
		if aerr != nil {
			return api.Fail(w, span, aerr)
		}
		defer release()
		body = b
	}
	if rest == "" {
		return e.createConversation(ctx, w, body, span)
	}
	ref, aerr := e.ResolveConversation(id, e.cfg.Now())
	if aerr != nil {
		return api.Fail(w, span, aerr)
	}
	span.SetAttributes(observe.AttrInstance.String(ref.ID.Instance), attribute.String("tether.conversation", id))
	return e.conversationHop(ctx, w, r.Method, ref.target("/v1/conversations/", sub, r.URL.RawQuery), body, ref, nil, span)
}

// conversationHop sends one request to the instance holding a
// conversation and relays its answer with the client's ids; for a create
// (ref nil), mint gives the new conversation's id.
func (e *Service) conversationHop(ctx context.Context, w http.ResponseWriter, method, target string, body []byte, ref *Ref,
	mint func(upstream string) string, span trace.Span) int {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.UpstreamTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return api.Fail(w, span, api.NewError(http.StatusInternalServerError, "server_error", "internal_error", "", "building the request: %v", err))
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	observe.TraceContext.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := e.cfg.Client.Do(req)
	if err != nil {
		if ref != nil {
			return api.Fail(w, span, ref.Unreachable(Conversation, err))
		}
		ae := api.NewError(http.StatusServiceUnavailable, "server_error", "upstream_unavailable", "",
			"the instance chosen for the new conversation is unreachable (%s); retry shortly", HopFailure(err))
		ae.RetryAfter = time.Second
		return api.Fail(w, span, ae)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, api.MaxUpstreamBody))
	if err != nil {
		return api.Fail(w, span, api.NewError(http.StatusBadGateway, "server_error", "upstream_error", "", "reading the instance's answer: %v", err))
	}
	if mint != nil && resp.StatusCode == http.StatusOK {
		var obj struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(b, &obj) != nil || obj.ID == "" {
			return api.Fail(w, span, api.NewError(http.StatusBadGateway, "server_error", "upstream_error", "", "the instance answered a conversation without an id: %s", httpjson.Clip(string(b), 200)))
		}
		ref = &Ref{Client: mint(obj.ID), ID: respid.ID{Upstream: obj.ID}}
		e.cfg.Metrics.Conversations.WithLabelValues("created").Inc()
	}
	if ref != nil {
		// The worker names its own id; the client knows the one it got.
		b = bytes.ReplaceAll(b, []byte(ref.ID.Upstream), []byte(ref.Client))
	}
	return (&api.UpstreamAnswer{Status: resp.StatusCode, Header: resp.Header, Body: b}).Write(w)
}

// createConversation serves POST /v1/conversations: the conversation goes
// to an instance of the generation fleet of the model the body names
// (model: a tether extension, OpenAI's conversations have none; default
// the first model served), placed as an unkeyed request.
func (e *Service) createConversation(ctx context.Context, w http.ResponseWriter, body []byte, span trace.Span) int {
	top := map[string]json.RawMessage{}
	if len(bytes.TrimSpace(body)) > 0 {
		if err := json.Unmarshal(body, &top); err != nil || top == nil {
			return api.Fail(w, span, api.BadRequest("", "", "the request body must be a JSON object"))
		}
	}
	m := e.cfg.Catalogue.First()
	if raw, ok := top["model"]; ok {
		var name string
		if json.Unmarshal(raw, &name) != nil {
			return api.Fail(w, span, api.BadRequest("invalid_type", "model", "invalid type for \"model\": want a string, got %s", apireq.Kind(raw)))
		}
		var found bool
		if m, _, found = e.cfg.Catalogue.Lookup(name); !found {
			return api.Fail(w, span, e.cfg.Catalogue.NotFound(name))
		}
		delete(top, "model")
		body = api.MustMarshal(top)
	}
	if aerr := m.ServesConversations(); aerr != nil {
		return api.Fail(w, span, aerr)
	}
	inst, url, aerr := e.edge.PlaceConversation(ctx, m)
	if aerr != nil {
		return api.Fail(w, span, aerr)
	}
	span.SetAttributes(observe.AttrInstance.String(inst), attribute.String("tether.model", m.Name))
	var boot uint64
	if in, ok := e.edge.Fleet().Instance(inst, e.cfg.Now()); ok {
		boot = in.BootID
	}
	mint := func(upstream string) string {
		return e.cfg.Codec.MintConversation(respid.ID{Fleet: uint8(m.Cfg.AnswerFleet()), Instance: inst, Rank: -1, BootID: boot,
			Upstream: upstream, Edge: e.cfg.NodeID, Minted: e.cfg.Now()})
	}
	return e.conversationHop(ctx, w, http.MethodPost, url+"/v1/conversations", body, nil, mint, span)
}
