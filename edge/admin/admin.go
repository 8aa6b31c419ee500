// Package admin is the edge's admin API (/admin/v1/*, on the edge's port):
// cluster status, bindings and their history from the archive, the
// instance view, state hashes, snapshot and restore, Raft membership. It
// reads and changes the edge's cluster node and reads its fleet view through
// Edge, which the edge implements; it does not import the edge. The paths
// and answers are in edge/DESIGN.md ("Admin API").
package admin

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/httpjson"
)

// Prefix is the admin API's path prefix (on the edge's port).
const Prefix = "/admin/v1/"

// EnvToken is the environment variable that sets the admin token (the
// edge's config reads it: edge.EnvAdminToken, the same name).
const EnvToken = "TETHER_ADMIN_TOKEN"

// Edge is what the admin API asks of the edge serving it, per request (the
// node exists once the edge started).
type Edge interface {
	// Node is the edge's cluster node.
	Node() *cluster.Node
	// Fleet is the edge's view of the workers.
	Fleet() *fleetview.View
	// Now is the edge's clock.
	Now() time.Time
	// DegradedPending counts degraded placements not yet recorded in the log.
	DegradedPending() int
	// WorkingSet is the instance's working set as this edge's placement
	// weighs it: the conversations the edges sent it lately and their
	// prompts' KV blocks (routing's Decider.WorkingSet; zero for an
	// instance of no model of this edge).
	WorkingSet(f fsm.Fleet, instance string, now time.Time) (conversations int, blocks int64)
	// OverloadedSince is since when the edge has counted instance unable
	// to take its bound keys (edge/route strain.go; ok false: it has not).
	OverloadedSince(instance string) (since time.Time, ok bool)
}

// Options configure the API.
type Options struct {
	// Token is the bearer token every call needs ("" disables the API).
	Token string
	// NodeID names this edge in answers and snapshot file names.
	NodeID string
	// DataDir is where snapshots are spooled before they are sent.
	DataDir string
	// Answered, when set, is told every answer's status (metrics).
	Answered func(status int)
	// Models is the edge's catalogue, its first model first (empty: one
	// model). The keys of a model other than the first are in its
	// namespace (fsm.ModelKey); ?model= on a binding path names it.
	Models []string
}

// API serves /admin/v1/*, guarded by the bearer token (compared in constant
// time). Without a configured token every admin request is refused.
type API struct {
	edge Edge
	opts Options
}

// New makes the admin API of edge.
func New(edge Edge, opts Options) *API { return &API{edge: edge, opts: opts} }

func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	status := a.serve(w, r)
	if a.opts.Answered != nil {
		a.opts.Answered(status)
	}
}

// apiError is the OpenAI-style error body the edge's other endpoints answer
// with too (same fields, same order).
type apiError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"`
	Code    any    `json:"code"`
}

// Error writes an OpenAI-style error answer and returns status. The edge
// uses it for the token check of /metrics as well.
func Error(w http.ResponseWriter, status int, code, format string, args ...any) int {
	typ := "invalid_request_error"
	switch {
	case status == http.StatusUnauthorized:
		typ = "authentication_error"
	case status == http.StatusForbidden:
		typ = "permission_error"
	case status >= 500:
		typ = "server_error"
	}
	e := &apiError{Message: fmt.Sprintf(format, args...), Type: typ}
	if code != "" {
		e.Code = code
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Error *apiError `json:"error"`
	}{e})
	return status
}

// writeJSON and truncate are the shared JSON answer and message quoting.
var (
	writeJSON = httpjson.Write
	truncate  = httpjson.Clip
)

func methodNotAllowed(w http.ResponseWriter, r *http.Request, allowed string) int {
	w.Header().Set("Allow", allowed)
	return Error(w, http.StatusMethodNotAllowed, "method_not_allowed",
		"method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allowed)
}

// Authorized reports whether r carries "Authorization: Bearer <token>"
// with the configured token (never, when token is "").
func Authorized(r *http.Request, token string) bool {
	tok, ok := bearerToken(r.Header.Get("Authorization"))
	return ok && token != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(token)) == 1
}

// bearerToken extracts the token of an "Authorization: Bearer <token>"
// header. The scheme is case-insensitive (RFC 9110 §11.1: "bearer" and
// "BEARER" are the same scheme).
func bearerToken(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

func (a *API) serve(w http.ResponseWriter, r *http.Request) int {
	if a.opts.Token == "" {
		return Error(w, http.StatusForbidden, "admin_disabled", "the admin API is disabled: set admin_token (or %s)", EnvToken)
	}
	if !Authorized(r, a.opts.Token) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="tether-admin"`)
		return Error(w, http.StatusUnauthorized, "unauthorized", "the admin API needs Authorization: Bearer <admin_token>")
	}
	path := strings.TrimPrefix(r.URL.EscapedPath(), strings.TrimSuffix(Prefix, "/"))
	get := func(h func(http.ResponseWriter, *http.Request) int) int {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			return methodNotAllowed(w, r, http.MethodGet)
		}
		return h(w, r)
	}
	post := func(h func(http.ResponseWriter, *http.Request) int) int {
		if r.Method != http.MethodPost {
			return methodNotAllowed(w, r, http.MethodPost)
		}
		return h(w, r)
	}
	switch {
	case path == "/cluster":
		return get(a.cluster)
	case path == "/instances":
		return get(a.instances)
	case strings.HasPrefix(path, "/instances/"):
		return post(func(w http.ResponseWriter, r *http.Request) int {
			return a.drain(w, r, strings.TrimPrefix(path, "/instances/"))
		})
	case path == "/state/hash":
		return get(a.stateHash)
	case path == "/snapshot":
		return get(a.snapshot)
	case path == "/snapshot/restore":
		return post(a.restore)
	case path == "/raft/remove-peer":
		return post(a.removePeer)
	case path == "/raft/transfer-leader":
		return post(a.transferLeader)
	case path == "/raft/add-voter":
		return post(a.addVoter)
	case strings.HasPrefix(path, "/bindings/"):
		return get(func(w http.ResponseWriter, r *http.Request) int {
			return a.binding(w, r, strings.TrimPrefix(path, "/bindings/"))
		})
	}
	return Error(w, http.StatusNotFound, "unknown_url", "unknown admin path %s (see edge/DESIGN.md for the admin API)", truncate(r.URL.Path, 200))
}
