package admin

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tether-project/tether/cluster"
)

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

func (a *API) cluster(w http.ResponseWriter, r *http.Request) int {
	s := a.edge.Node().Status()
	st := a.edge.Node().State()
	info := ClusterInfo{
		NodeID: s.ID, Addr: s.Addr, RaftState: s.RaftState, IsLeader: s.IsLeader, Leader: s.Leader, LeaderAddr: s.LeaderAddr,
		Term: s.Term, AppliedIndex: s.AppliedIndex, CommitIndex: s.CommitIndex, StateIndex: s.StateIndex, StateHash: s.StateHash,
		FeatureLevel: s.ClusterFeatureLevel, NodeFeatureLevel: s.FeatureLevel, Bindings: s.Bindings, Links: st.LinkCount(),
		MaxBindings: st.MaxBindings(), Version: s.Version, Halted: s.Halted, Peers: s.Peers,
		DegradedPending: a.edge.DegradedPending(),
	}
	if !s.LastContact.IsZero() {
		t := s.LastContact
		info.LastLeaderContactAt = &t
	}
	if !s.IsLeader && s.LeaderAddr != "" {
		// Member health (autopilot's) lives on the leader: show its view.
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		if ls, err := a.edge.Node().PeerStatus(ctx, s.LeaderAddr); err == nil && ls.IsLeader {
			info.Peers = ls.Peers
		}
		cancel()
	}
	if info.Peers == nil {
		info.Peers = []cluster.PeerStatus{}
	}
	info.Nodes = []NodeInfo{}
	for _, n := range st.Edges() {
		info.Nodes = append(info.Nodes, NodeInfo{ID: n.ID, Version: n.Version, MaxFeatureLevel: n.MaxFeatureLevel})
	}
	writeJSON(w, http.StatusOK, info)
	return http.StatusOK
}

// stateHash answers the state hash: the current state's, or with
// ?index=N the hash of the state at exactly N (once applied, if the node
// still remembers it: cluster.Node.HashAt), else the current state's.
func (a *API) stateHash(w http.ResponseWriter, r *http.Request) int {
	node := a.edge.Node()
	if s := r.URL.Query().Get("index"); s != "" {
		idx, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return Error(w, http.StatusBadRequest, "invalid_index", "index %q is not a log index: %v", s, err)
		}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		if err := node.WaitApplied(ctx, idx); err != nil {
			return Error(w, http.StatusGatewayTimeout, "index_not_applied", "%v", err)
		}
		if h, ok := node.HashAt(idx); ok {
			writeJSON(w, http.StatusOK, StateHash{Index: idx, Hash: hex.EncodeToString(h[:]), NodeID: a.opts.NodeID, Exact: true})
			return http.StatusOK
		}
	}
	st := node.State()
	h := st.Hash()
	n := st.Len()
	writeJSON(w, http.StatusOK, StateHash{Index: st.Index(), Hash: hex.EncodeToString(h[:]), Bindings: &n, NodeID: a.opts.NodeID})
	return http.StatusOK
}

// StateHash is GET /admin/v1/state/hash.
type StateHash struct {
	Index uint64 `json:"index"`
	Hash  string `json:"hash"` // hex
	// Bindings is the current state's binding count (absent for an
	// earlier state's hash).
	Bindings *int   `json:"bindings,omitempty"`
	NodeID   string `json:"node_id"`
	// Exact: the hash of the state at exactly the asked index (the node
	// remembered it), not of the current state.
	Exact bool `json:"exact,omitempty"`
}

// Snapshot response headers.
const (
	HeaderSnapshotIndex    = "X-Tether-Snapshot-Index"
	HeaderSnapshotTerm     = "X-Tether-Snapshot-Term"
	HeaderSnapshotHash     = "X-Tether-Snapshot-Hash"
	HeaderSnapshotBindings = "X-Tether-Snapshot-Bindings"
)

// snapshot spools the state snapshot to the data dir first, so its
// index, term and hash can go in the headers before the body.
func (a *API) snapshot(w http.ResponseWriter, r *http.Request) int {
	f, err := os.CreateTemp(a.opts.DataDir, "admin-snapshot-*.snap")
	if err != nil {
		return Error(w, http.StatusInternalServerError, "snapshot_failed", "spooling the snapshot: %v", err)
	}
	defer func() {
		f.Close()
		os.Remove(f.Name())
	}()
	meta, err := a.edge.Node().WriteSnapshot(r.Context(), f)
	if err != nil {
		return Error(w, http.StatusInternalServerError, "snapshot_failed", "%v", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Error(w, http.StatusInternalServerError, "snapshot_failed", "%v", err)
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(meta.Size, 10))
	h.Set("Content-Disposition", fmt.Sprintf(`attachment; filename="tether-%s-%d.snap"`, a.opts.NodeID, meta.Index))
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

func (a *API) restore(w http.ResponseWriter, r *http.Request) int {
	if err := a.edge.Node().Restore(r.Context(), r.Body); err != nil {
		var nl *cluster.NotLeaderError
		if errors.As(err, &nl) {
			return Error(w, http.StatusConflict, "not_leader", "restore must run on the leader (%s at %s); %v", nl.LeaderID, nl.LeaderAddr, err)
		}
		if strings.Contains(err.Error(), "invalid snapshot") {
			return Error(w, http.StatusBadRequest, "invalid_snapshot", "%v", err)
		}
		return Error(w, http.StatusInternalServerError, "restore_failed", "%v", err)
	}
	st := a.edge.Node().State()
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
		return req, Error(w, http.StatusBadRequest, "invalid_json", "want a JSON object like {\"id\": \"edge-2\", \"addr\": \"10.0.0.2:7400\"}: %v", err), false
	}
	if needID && req.ID == "" {
		return req, Error(w, http.StatusBadRequest, "missing_id", "\"id\" is required"), false
	}
	if needAddr && req.Addr == "" {
		return req, Error(w, http.StatusBadRequest, "missing_addr", "\"addr\" is required"), false
	}
	return req, 0, true
}

func (a *API) raftResult(w http.ResponseWriter, op string, err error) int {
	if err != nil {
		status := http.StatusInternalServerError
		var nl *cluster.NotLeaderError
		switch {
		case errors.As(err, &nl), errors.Is(err, cluster.ErrNotLeader):
			status = http.StatusConflict
		case errors.Is(err, cluster.ErrUnavailable):
			status = http.StatusServiceUnavailable
		case errors.Is(err, cluster.ErrBadRequest):
			status = http.StatusBadRequest
		}
		return Error(w, status, "raft_"+strings.ReplaceAll(op, "-", "_")+"_failed", "%s: %v", op, err)
	}
	s := a.edge.Node().Status()
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "op": op, "leader": s.Leader, "peers": s.Peers})
	return http.StatusOK
}

func (a *API) removePeer(w http.ResponseWriter, r *http.Request) int {
	req, status, ok := readRaftRequest(w, r, true, false)
	if !ok {
		return status
	}
	if !a.isPeer(req.ID) {
		return Error(w, http.StatusNotFound, "unknown_peer", "remove-peer: %q is not a member of the cluster (GET /admin/v1/cluster lists the peers)", req.ID)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	return a.raftResult(w, "remove-peer", a.edge.Node().RemoveServer(ctx, req.ID))
}

func (a *API) transferLeader(w http.ResponseWriter, r *http.Request) int {
	req, status, ok := readRaftRequest(w, r, false, false)
	if !ok {
		return status
	}
	if req.ID != "" && !a.isPeer(req.ID) {
		return Error(w, http.StatusNotFound, "unknown_peer", "transfer-leader: %q is not a member of the cluster (GET /admin/v1/cluster lists the peers)", req.ID)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	return a.raftResult(w, "transfer-leader", a.edge.Node().TransferLeadership(ctx, req.ID))
}

// isPeer reports whether id is in the Raft configuration this edge knows.
// Operator mistakes (an unknown id) are answered 404 here: raft answered
// them 500 (transfer-leader) or 200 (remove-peer of nobody).
func (a *API) isPeer(id string) bool {
	for _, p := range a.edge.Node().Status().Peers {
		if p.ID == id {
			return true
		}
	}
	return false
}

func (a *API) addVoter(w http.ResponseWriter, r *http.Request) int {
	req, status, ok := readRaftRequest(w, r, true, true)
	if !ok {
		return status
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	return a.raftResult(w, "add-voter", a.edge.Node().AddVoter(ctx, req.ID, req.Addr))
}
