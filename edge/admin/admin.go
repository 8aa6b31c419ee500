package edge

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/fsm"
)

// adminPrefix is the admin API's path prefix (on the edge's port).
const adminPrefix = "/admin/v1/"

// adminHandler serves /admin/v1/*, guarded by the bearer admin_token
// (compared in constant time). Without a configured token every admin
// request is refused.
func (e *Edge) adminHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status := e.serveAdmin(w, r)
		e.metrics.requests.WithLabelValues("admin", strconv.Itoa(status)).Inc()
	})
}

func adminError(w http.ResponseWriter, status int, code, format string, args ...any) int {
	typ := "invalid_request_error"
	switch {
	case status == http.StatusUnauthorized:
		typ = "authentication_error"
	case status == http.StatusForbidden:
		typ = "permission_error"
	case status >= 500:
		typ = "server_error"
	}
	writeAPIError(w, newAPIError(status, typ, code, "", format, args...))
	return status
}

func (e *Edge) authorized(r *http.Request) bool {
	tok, ok := bearerToken(r.Header.Get("Authorization"))
	return ok && e.cfg.AdminToken != "" && constantTimeEqual(tok, e.cfg.AdminToken)
}

// bearerToken extracts the token of an "Authorization: Bearer <token>"
// header. The scheme is case-insensitive (RFC 9110 §11.1: "bearer" and
// "BEARER" are the same scheme; issue 13, D5).
func bearerToken(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

func (e *Edge) serveAdmin(w http.ResponseWriter, r *http.Request) int {
	if e.cfg.AdminToken == "" {
		return adminError(w, http.StatusForbidden, "admin_disabled", "the admin API is disabled: set admin_token (or %s)", EnvAdminToken)
	}
	if !e.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="tether-admin"`)
		return adminError(w, http.StatusUnauthorized, "unauthorized", "the admin API needs Authorization: Bearer <admin_token>")
	}
	path := strings.TrimPrefix(r.URL.EscapedPath(), strings.TrimSuffix(adminPrefix, "/"))
	get := func(h func(http.ResponseWriter, *http.Request) int) int {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			methodNotAllowed(w, r, http.MethodGet)
			return http.StatusMethodNotAllowed
		}
		return h(w, r)
	}
	post := func(h func(http.ResponseWriter, *http.Request) int) int {
		if r.Method != http.MethodPost {
			methodNotAllowed(w, r, http.MethodPost)
			return http.StatusMethodNotAllowed
		}
		return h(w, r)
	}
	switch {
	case path == "/cluster":
		return get(e.adminCluster)
	case path == "/instances":
		return get(e.adminInstances)
	case path == "/state/hash":
		return get(e.adminStateHash)
	case path == "/snapshot":
		return get(e.adminSnapshot)
	case path == "/snapshot/restore":
		return post(e.adminRestore)
	case path == "/raft/remove-peer":
		return post(e.adminRemovePeer)
	case path == "/raft/transfer-leader":
		return post(e.adminTransferLeader)
	case path == "/raft/add-voter":
		return post(e.adminAddVoter)
	case strings.HasPrefix(path, "/bindings/"):
		return get(func(w http.ResponseWriter, r *http.Request) int {
			return e.adminBinding(w, r, strings.TrimPrefix(path, "/bindings/"))
		})
	}
	return adminError(w, http.StatusNotFound, "unknown_url", "unknown admin path %s (see edge/DESIGN.md for the admin API)", truncate(r.URL.Path, 200))
}

// ClusterInfo is GET /admin/v1/cluster.
type ClusterInfo struct {
	NodeID              string               `json:"node_id"`
	Addr                string               `json:"addr"`
	RaftState           string               `json:"raft_state"`
	IsLeader            bool                 `json:"is_leader"`
	Leader              string               `json:"leader"`
	LeaderAddr          string               `json:"leader_addr"`
	Term                uint64               `json:"term"`
	AppliedIndex        uint64               `json:"applied_index"`
	CommitIndex         uint64               `json:"commit_index"`
	StateIndex          uint64               `json:"state_index"`
	StateHash           string               `json:"state_hash"`
	FeatureLevel        uint32               `json:"feature_level"`
	NodeFeatureLevel    uint32               `json:"node_feature_level"`
	Bindings            int                  `json:"bindings"`
	Links               int                  `json:"links"`
	MaxBindings         uint64               `json:"max_bindings"`
	Version             string               `json:"version"`
	Halted              string               `json:"halted,omitempty"`
	Peers               []cluster.PeerStatus `json:"peers"`
	Nodes               []NodeInfo           `json:"nodes"`
	DegradedPending     int                  `json:"degraded_pending"`
	LastLeaderContactAt *time.Time           `json:"last_leader_contact,omitempty"`
}

// NodeInfo is an edge as the log knows it.
type NodeInfo struct {
	ID              string `json:"id"`
	Version         string `json:"version"`
	MaxFeatureLevel uint32 `json:"max_feature_level"`
}

func (e *Edge) adminCluster(w http.ResponseWriter, r *http.Request) int {
	s := e.node.Status()
	st := e.node.State()
	info := ClusterInfo{
		NodeID: s.ID, Addr: s.Addr, RaftState: s.RaftState, IsLeader: s.IsLeader, Leader: s.Leader, LeaderAddr: s.LeaderAddr,
		Term: s.Term, AppliedIndex: s.AppliedIndex, CommitIndex: s.CommitIndex, StateIndex: s.StateIndex, StateHash: s.StateHash,
		FeatureLevel: s.ClusterFeatureLevel, NodeFeatureLevel: s.FeatureLevel, Bindings: s.Bindings, Links: st.LinkCount(),
		MaxBindings: st.MaxBindings(), Version: s.Version, Halted: s.Halted, Peers: s.Peers,
		DegradedPending: e.recorder.pendingDegraded(),
	}
	if !s.LastContact.IsZero() {
		t := s.LastContact
		info.LastLeaderContactAt = &t
	}
	if !s.IsLeader && s.LeaderAddr != "" {
		// Member health (autopilot's) lives on the leader: show its view.
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		if ls, err := e.node.PeerStatus(ctx, s.LeaderAddr); err == nil && ls.IsLeader {
			info.Peers = ls.Peers
		}
		cancel()
	}
	if info.Peers == nil {
		info.Peers = []cluster.PeerStatus{}
	}
	info.Nodes = []NodeInfo{}
	for _, n := range st.Nodes() {
		info.Nodes = append(info.Nodes, NodeInfo{ID: n.ID, Version: n.Version, MaxFeatureLevel: n.MaxFeatureLevel})
	}
	writeJSON(w, http.StatusOK, info)
	return http.StatusOK
}

// BindingInfo is GET /admin/v1/bindings/{fleet}/{key}.
type BindingInfo struct {
	Fleet          string         `json:"fleet"`
	Key            string         `json:"key"`
	ConversationID string         `json:"conversation_id"`
	Instance       string         `json:"instance"`
	Epoch          uint64         `json:"epoch"`
	BoundAt        time.Time      `json:"bound_at"`
	LastUsed       time.Time      `json:"last_used"`
	Edge           string         `json:"edge"`
	Policy         string         `json:"policy"`
	RequestID      string         `json:"request_id"`
	Candidates     []CandidateRow `json:"candidates"`
	StateIndex     uint64         `json:"state_index"`
	// Rank is the attention-DP rank the worker reported for this
	// placement (RankObserved, feature level 2); absent until reported.
	Rank *uint32 `json:"rank,omitempty"`
}

// CandidateRow is one scored option of a placement.
type CandidateRow struct {
	Instance     string  `json:"instance"`
	Score        float64 `json:"score"`
	CachedTokens uint32  `json:"cached_tokens"`
	LoadTokens   uint32  `json:"load_tokens"`
}

// HistoryEntry is one element of GET /admin/v1/bindings/{fleet}/{key}/history.
type HistoryEntry struct {
	Index    uint64          `json:"index"`
	Time     time.Time       `json:"time"`
	Type     string          `json:"type"`
	Status   string          `json:"status"`
	Reason   string          `json:"reason,omitempty"`
	Event    map[string]any  `json:"event,omitempty"`
	Decision *DecisionRecord `json:"decision,omitempty"`
	// Evicted is set when this entry's apply removed the binding.
	Evicted *EvictedRecord `json:"evicted,omitempty"`
}

// DecisionRecord is a placement decision as the log keeps it.
type DecisionRecord struct {
	Edge       string         `json:"edge"`
	Policy     string         `json:"policy"`
	RequestID  string         `json:"request_id"`
	Candidates []CandidateRow `json:"candidates"`
}

// EvictedRecord is a binding removed by an entry's apply.
type EvictedRecord struct {
	Instance string `json:"instance"`
	Epoch    uint64 `json:"epoch"`
	Reason   string `json:"reason"`
}

func decisionRecord(d fsm.Decision) *DecisionRecord {
	out := &DecisionRecord{Edge: d.Edge, Policy: d.Policy, RequestID: d.RequestID, Candidates: candidateRows(d.Candidates)}
	return out
}

func candidateRows(cs []fsm.Candidate) []CandidateRow {
	out := make([]CandidateRow, len(cs))
	for i, c := range cs {
		out[i] = CandidateRow{Instance: c.Instance, Score: c.Score, CachedTokens: c.CachedTokens, LoadTokens: c.LoadTokens}
	}
	return out
}

func (e *Edge) adminBinding(w http.ResponseWriter, r *http.Request, rest string) int {
	history := false
	if p, ok := strings.CutSuffix(rest, "/history"); ok {
		rest, history = p, true
	}
	fleetStr, keyEsc, ok := strings.Cut(rest, "/")
	if !ok || keyEsc == "" {
		return adminError(w, http.StatusBadRequest, "invalid_path", "want /admin/v1/bindings/{fleet}/{key} (key URL-escaped)")
	}
	fleet, err := fsm.ParseFleet(fleetStr)
	if err != nil {
		return adminError(w, http.StatusBadRequest, "invalid_fleet", "%v", err)
	}
	key, err := url.PathUnescape(keyEsc)
	if err != nil {
		return adminError(w, http.StatusBadRequest, "invalid_key", "key %q is not URL-escaped correctly: %v", keyEsc, err)
	}
	if history {
		return e.adminHistory(w, r, fleet, key)
	}
	st := e.node.State()
	b, ok := st.Lookup(fleet, key)
	if !ok {
		return adminError(w, http.StatusNotFound, "binding_not_found", "no %s binding for key %q (state index %d)", fleet, key, st.Index())
	}
	info := BindingInfo{
		Fleet: fleet.String(), Key: b.Key, ConversationID: b.ConversationID, Instance: b.Instance, Epoch: b.Epoch,
		BoundAt: time.Unix(0, b.BoundAt).UTC(), LastUsed: time.Unix(0, b.LastUsed).UTC(),
		Edge: b.Decision.Edge, Policy: b.Decision.Policy, RequestID: b.Decision.RequestID,
		Candidates: candidateRows(b.Decision.Candidates), StateIndex: st.Index(),
	}
	if b.HasRank {
		rank := b.Rank
		info.Rank = &rank
	}
	writeJSON(w, http.StatusOK, info)
	return http.StatusOK
}

func (e *Edge) adminHistory(w http.ResponseWriter, r *http.Request, fleet fsm.Fleet, key string) int {
	// The archive is written just after apply: let it catch up with the
	// state this node serves, so history agrees with the binding endpoint.
	idx := e.node.State().Index()
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	behind := e.node.WaitArchived(ctx, idx) != nil
	cancel()
	recs, err := e.node.Archive().History(fleet, key)
	if err != nil {
		return adminError(w, http.StatusInternalServerError, "archive_error", "reading the archive: %v", err)
	}
	out := []HistoryEntry{}
	for _, rec := range recs {
		out = append(out, historyEntries(rec, fleet, key)...)
	}
	writeJSON(w, http.StatusOK, struct {
		Fleet  string         `json:"fleet"`
		Key    string         `json:"key"`
		Events []HistoryEntry `json:"events"`
		// ArchiveBehind: the archive had not caught up with state index
		// StateIndex within 2 s; the newest events may be missing.
		ArchiveBehind bool   `json:"archive_behind,omitempty"`
		StateIndex    uint64 `json:"state_index"`
	}{fleet.String(), key, out, behind, idx})
	return http.StatusOK
}

// historyEntries extracts the events of one archive record that concern
// (fleet, key): events naming it, and proposals whose apply evicted it.
func historyEntries(rec archive.Record, fleet fsm.Fleet, key string) []HistoryEntry {
	props, err := rec.Proposals()
	if err != nil {
		return []HistoryEntry{{Index: rec.Index, Time: time.Unix(0, rec.Time).UTC(), Type: "undecodable", Reason: err.Error()}}
	}
	var out []HistoryEntry
	for i, p := range props {
		var outcome archive.Outcome
		if i < len(rec.Outcomes) {
			outcome = rec.Outcomes[i]
		}
		names := false
		if p.Event != nil {
			for _, k := range fsm.EventKeys(p.Event) {
				if k.Fleet == fleet && k.Key == key {
					names = true
				}
			}
		}
		var evicted *EvictedRecord
		for _, ev := range outcome.Evicted {
			if ev.Fleet == fleet && ev.Key == key {
				evicted = &EvictedRecord{Instance: ev.Instance, Epoch: ev.Epoch, Reason: ev.Reason.String()}
			}
		}
		if !names && evicted == nil {
			continue
		}
		h := HistoryEntry{Index: rec.Index, Time: time.Unix(0, rec.Time).UTC(), Type: p.Type.String(),
			Status: outcome.Status.String(), Reason: outcome.Reason, Evicted: evicted}
		switch ev := p.Event.(type) {
		case fsm.Bind:
			h.Event = map[string]any{"instance": ev.Instance, "conversation_id": ev.ConversationID}
			h.Decision = decisionRecord(ev.Decision)
		case fsm.Overflow:
			h.Event = map[string]any{"from": ev.From, "to": ev.To, "reason": ev.Reason.String(), "rebind": ev.Rebind}
			h.Decision = decisionRecord(ev.Decision)
		case fsm.Evict:
			h.Event = map[string]any{"reason": ev.Reason.String(), "epoch": ev.Epoch, "idle_before": ev.IdleBefore, "detail": ev.Detail}
		case fsm.InstanceState:
			h.Event = map[string]any{"instance": ev.Instance, "status": ev.Status.String()}
		case fsm.Touch:
			h.Event = map[string]any{"keys": len(ev.Keys)}
		case fsm.RankObserved:
			h.Event = map[string]any{"rank": ev.Rank, "epoch": ev.Epoch}
		}
		out = append(out, h)
	}
	return out
}

// InstanceInfo is one element of GET /admin/v1/instances.
type InstanceInfo struct {
	ID                 string   `json:"id"`
	Fleet              string   `json:"fleet"`
	URL                string   `json:"url"`
	LogStatus          string   `json:"log_status"` // "" when the log has no record
	Healthy            bool     `json:"healthy"`
	Draining           bool     `json:"draining"`
	Static             bool     `json:"static"`
	Telemetry          bool     `json:"telemetry"`
	TelemetryAgeSecond *float64 `json:"telemetry_age_seconds"`
	Version            string   `json:"version"`
	FeatureLevel       int      `json:"feature_level"`
	VerifiesHints      bool     `json:"verifies_hints"`
	Ranks              int      `json:"ranks"`
	QueuedRequests     int      `json:"queued_requests"`
	ActiveRequests     int      `json:"active_requests"`
	ActivePromptTokens int64    `json:"active_prompt_tokens"`
	HitRate            float64  `json:"hit_rate"`
	Breaker            string   `json:"breaker"`
	Bindings           int      `json:"bindings"`
	KVStale            bool     `json:"kv_stale"`
	// TelemetryStale: the edge's NATS link is (or just was) down; the
	// load figures are from before and health comes from probes.
	TelemetryStale bool `json:"telemetry_stale"`
}

// kvStale reports whether the edge lacks an instance's KV state: the index
// has no trusted baseline for it and the instance may hold blocks. A
// healthy instance whose report says its cache is empty (an idle worker
// that never stored a block, so never sent a KV event) lacks nothing.
func kvStale(indexStale bool, in fleetview.Instance) bool {
	return indexStale && !(in.Telemetry && !in.TelemetryStale && in.KVUsedBlocks == 0)
}

func (e *Edge) adminInstances(w http.ResponseWriter, r *http.Request) int {
	now := e.now()
	st := e.node.State()
	out := []InstanceInfo{}
	seen := map[string]bool{}
	for _, in := range e.fleet.Instances(now) {
		seen[in.ID] = true
		info := InstanceInfo{
			ID: in.ID, Fleet: in.Fleet.String(), URL: in.URL, Healthy: in.Healthy, Draining: in.Draining, Static: in.Static,
			Telemetry: in.Telemetry, TelemetryStale: in.TelemetryStale, Version: in.Version, FeatureLevel: in.FeatureLevel, VerifiesHints: in.VerifiesHints,
			Ranks: in.Ranks, QueuedRequests: in.QueuedRequests + int(in.PendingRequests), ActiveRequests: in.ActiveRequests,
			ActivePromptTokens: in.ActivePromptTokens, HitRate: in.HitRate(), Breaker: in.Breaker.String(),
			Bindings: st.BindingCount(in.Fleet, in.ID), KVStale: kvStale(e.fleet.Index().Stale(in.ID), in),
		}
		if !in.LastSeen.IsZero() {
			age := now.Sub(in.LastSeen).Seconds()
			info.TelemetryAgeSecond = &age
		}
		if rec, ok := st.Instance(in.ID); ok {
			info.LogStatus = rec.Status.String()
		}
		out = append(out, info)
	}
	for _, rec := range st.Instances() {
		if !seen[rec.ID] {
			out = append(out, InstanceInfo{ID: rec.ID, Fleet: rec.Fleet.String(), URL: rec.URL, LogStatus: rec.Status.String(),
				Version: rec.Version, FeatureLevel: int(rec.FeatureLevel), Ranks: int(rec.Ranks), Breaker: "closed",
				Bindings: st.BindingCount(rec.Fleet, rec.ID)})
		}
	}
	writeJSON(w, http.StatusOK, struct {
		Instances []InstanceInfo `json:"instances"`
	}{out})
	return http.StatusOK
}

func (e *Edge) adminStateHash(w http.ResponseWriter, r *http.Request) int {
	if s := r.URL.Query().Get("index"); s != "" {
		idx, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return adminError(w, http.StatusBadRequest, "invalid_index", "index %q is not a log index: %v", s, err)
		}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		if err := e.node.WaitApplied(ctx, idx); err != nil {
			return adminError(w, http.StatusGatewayTimeout, "index_not_applied", "%v", err)
		}
	}
	st := e.node.State()
	h := st.Hash()
	writeJSON(w, http.StatusOK, map[string]any{"index": st.Index(), "hash": hex.EncodeToString(h[:]), "bindings": st.Len(), "node_id": e.nodeID})
	return http.StatusOK
}

// Snapshot response headers.
const (
	HeaderSnapshotIndex    = "X-Tether-Snapshot-Index"
	HeaderSnapshotTerm     = "X-Tether-Snapshot-Term"
	HeaderSnapshotHash     = "X-Tether-Snapshot-Hash"
	HeaderSnapshotBindings = "X-Tether-Snapshot-Bindings"
)

// adminSnapshot spools the state snapshot to the data dir first, so its
// index, term and hash can go in the headers before the body.
func (e *Edge) adminSnapshot(w http.ResponseWriter, r *http.Request) int {
	f, err := os.CreateTemp(e.cfg.Cluster.DataDir, "admin-snapshot-*.snap")
	if err != nil {
		return adminError(w, http.StatusInternalServerError, "snapshot_failed", "spooling the snapshot: %v", err)
	}
	defer func() {
		f.Close()
		os.Remove(f.Name())
	}()
	meta, err := e.node.WriteSnapshot(r.Context(), f)
	if err != nil {
		return adminError(w, http.StatusInternalServerError, "snapshot_failed", "%v", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return adminError(w, http.StatusInternalServerError, "snapshot_failed", "%v", err)
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(meta.Size, 10))
	h.Set("Content-Disposition", fmt.Sprintf(`attachment; filename="tether-%s-%d.snap"`, e.nodeID, meta.Index))
	h.Set(HeaderSnapshotIndex, strconv.FormatUint(meta.Index, 10))
	h.Set(HeaderSnapshotTerm, strconv.FormatUint(meta.Term, 10))
	h.Set(HeaderSnapshotHash, meta.Hash)
	h.Set(HeaderSnapshotBindings, strconv.Itoa(meta.Bindings))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = io.Copy(w, f)
	}
	return http.StatusOK
}

func (e *Edge) adminRestore(w http.ResponseWriter, r *http.Request) int {
	if err := e.node.Restore(r.Context(), r.Body); err != nil {
		var nl *cluster.NotLeaderError
		if errors.As(err, &nl) {
			return adminError(w, http.StatusConflict, "not_leader", "restore must run on the leader (%s at %s); %v", nl.LeaderID, nl.LeaderAddr, err)
		}
		if strings.Contains(err.Error(), "invalid snapshot") {
			return adminError(w, http.StatusBadRequest, "invalid_snapshot", "%v", err)
		}
		return adminError(w, http.StatusInternalServerError, "restore_failed", "%v", err)
	}
	st := e.node.State()
	h := st.Hash()
	writeJSON(w, http.StatusOK, map[string]any{"restored": true, "index": st.Index(), "hash": hex.EncodeToString(h[:]), "bindings": st.Len()})
	return http.StatusOK
}

type raftRequest struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
}

func readRaftRequest(w http.ResponseWriter, r *http.Request, needID, needAddr bool) (raftRequest, int, bool) {
	var req raftRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil && !(errors.Is(err, io.EOF) && !needID && !needAddr) {
		return req, adminError(w, http.StatusBadRequest, "invalid_json", "want a JSON object like {\"id\": \"edge-2\", \"addr\": \"10.0.0.2:7400\"}: %v", err), false
	}
	if needID && req.ID == "" {
		return req, adminError(w, http.StatusBadRequest, "missing_id", "\"id\" is required"), false
	}
	if needAddr && req.Addr == "" {
		return req, adminError(w, http.StatusBadRequest, "missing_addr", "\"addr\" is required"), false
	}
	return req, 0, true
}

func (e *Edge) raftResult(w http.ResponseWriter, op string, err error) int {
	if err != nil {
		status := http.StatusInternalServerError
		var nl *cluster.NotLeaderError
		switch {
		case errors.As(err, &nl), errors.Is(err, cluster.ErrNotLeader):
			status = http.StatusConflict
		case errors.Is(err, cluster.ErrUnavailable):
			status = http.StatusServiceUnavailable
		}
		return adminError(w, status, "raft_"+strings.ReplaceAll(op, "-", "_")+"_failed", "%s: %v", op, err)
	}
	s := e.node.Status()
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "op": op, "leader": s.Leader, "peers": s.Peers})
	return http.StatusOK
}

func (e *Edge) adminRemovePeer(w http.ResponseWriter, r *http.Request) int {
	req, status, ok := readRaftRequest(w, r, true, false)
	if !ok {
		return status
	}
	if !e.isPeer(req.ID) {
		return adminError(w, http.StatusNotFound, "unknown_peer", "remove-peer: %q is not a member of the cluster (GET /admin/v1/cluster lists the peers)", req.ID)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	return e.raftResult(w, "remove-peer", e.node.RemoveServer(ctx, req.ID))
}

func (e *Edge) adminTransferLeader(w http.ResponseWriter, r *http.Request) int {
	req, status, ok := readRaftRequest(w, r, false, false)
	if !ok {
		return status
	}
	if req.ID != "" && !e.isPeer(req.ID) {
		return adminError(w, http.StatusNotFound, "unknown_peer", "transfer-leader: %q is not a member of the cluster (GET /admin/v1/cluster lists the peers)", req.ID)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	return e.raftResult(w, "transfer-leader", e.node.TransferLeadership(ctx, req.ID))
}

// isPeer reports whether id is in the Raft configuration this edge knows.
// Operator mistakes (an unknown id) are answered 404 here: raft answered
// them 500 (transfer-leader) or 200 (remove-peer of nobody).
func (e *Edge) isPeer(id string) bool {
	for _, p := range e.node.Status().Peers {
		if p.ID == id {
			return true
		}
	}
	return false
}

func (e *Edge) adminAddVoter(w http.ResponseWriter, r *http.Request) int {
	req, status, ok := readRaftRequest(w, r, true, true)
	if !ok {
		return status
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	return e.raftResult(w, "add-voter", e.node.AddVoter(ctx, req.ID, req.Addr))
}
