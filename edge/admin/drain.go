package admin

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/fsm"
)

// DrainResult is the answer of POST /admin/v1/instances/{id}/drain and
// /undrain: the instance's record once the change committed and this edge
// applied it.
type DrainResult struct {
	Instance string `json:"instance"`
	Fleet    string `json:"fleet"`
	// Drained: an operator drained it: no new conversations, and each bound
	// one moves to another instance on its next turn (overflow reason
	// drained).
	Drained bool `json:"drained"`
	// DrainedSince is the log time of the drain (absent when not drained).
	DrainedSince *time.Time `json:"drained_since,omitempty"`
	// Changed is false when the instance already was as asked.
	Changed bool `json:"changed"`
	// LogStatus is the status the leader derives from telemetry (up,
	// draining: the worker is shutting down, down).
	LogStatus string `json:"log_status"`
	// Bindings still on the instance; they leave as their conversations
	// take their next turns (idle ones when their TTL expires or the
	// instance goes down).
	Bindings   int    `json:"bindings"`
	StateIndex uint64 `json:"state_index"`
}

// drainTimeout bounds the commit of a drain (a proposal gives up earlier,
// after the cluster's propose timeout, when there is no quorum).
const drainTimeout = 10 * time.Second

// drain serves POST /admin/v1/instances/{id}/drain (drain true) and
// /undrain: it records the operator's intent in the affinity log
// (fsm.InstanceDrain), so every edge agrees, it survives leader changes
// and restarts, and the leader's telemetry-driven instance states leave it
// alone. Any edge takes it (a follower forwards the proposal).
func (a *API) drain(w http.ResponseWriter, r *http.Request, rest string) int {
	idEsc, op, ok := cutLast(rest, "/")
	if !ok || idEsc == "" || (op != "drain" && op != "undrain") {
		return Error(w, http.StatusNotFound, "unknown_url", "want POST /admin/v1/instances/{id}/drain or /undrain (id URL-escaped)")
	}
	id, err := url.PathUnescape(idEsc)
	if err != nil || id == "" || strings.Contains(id, "/") {
		return Error(w, http.StatusBadRequest, "invalid_instance", "instance id %q is not URL-escaped correctly", truncate(idEsc, 200))
	}
	drain := op == "drain"
	node := a.edge.Node()
	st := node.State()
	if lvl := st.FeatureLevel(); lvl < fsm.FeatureLevelDrain {
		return Error(w, http.StatusConflict, "feature_level_too_low",
			"%s needs cluster feature level %d; the cluster is at level %d (every voting edge must run a release that supports level %d: GET /admin/v1/cluster lists each edge's max_feature_level)",
			op, fsm.FeatureLevelDrain, lvl, fsm.FeatureLevelDrain)
	}
	before, ok := st.Instance(id)
	if !ok {
		return Error(w, http.StatusNotFound, "instance_not_found",
			"%s: the log has no record of instance %q (GET /admin/v1/instances lists the instances and their log_status)", op, truncate(id, 200))
	}
	ctx, cancel := context.WithTimeout(r.Context(), drainTimeout)
	defer cancel()
	res, err := node.Propose(ctx, fsm.InstanceDrain{Instance: id, Drain: drain, Source: "admin via " + a.opts.NodeID})
	notApplied := errors.Is(err, cluster.ErrNotApplied) // committed: the result is valid
	if err != nil && !notApplied {
		status := http.StatusInternalServerError
		if errors.Is(err, cluster.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
			status = http.StatusServiceUnavailable
		}
		return Error(w, status, op+"_failed", "%s %s: %v", op, id, err)
	}
	if res.Status == fsm.StatusRejected {
		return Error(w, http.StatusConflict, op+"_rejected", "%s %s: %s", op, id, res.Reason)
	}
	if notApplied && !waitDrainApplied(ctx, node, id, drain) {
		return Error(w, http.StatusGatewayTimeout, op+"_not_applied", "%s %s committed, but this edge has not applied it yet: %v", op, id, err)
	}
	st = node.State()
	rec, ok := st.Instance(id)
	if !ok {
		return Error(w, http.StatusConflict, op+"_rejected", "%s %s: the instance's record was removed meanwhile", op, id)
	}
	out := DrainResult{Instance: rec.ID, Fleet: rec.Fleet.String(), Drained: rec.Drained, Changed: before.Drained != drain,
		LogStatus: rec.Status.String(), Bindings: st.BindingCount(rec.Fleet, rec.ID), StateIndex: st.Index()}
	out.DrainedSince = drainedSince(rec)
	writeJSON(w, http.StatusOK, out)
	return http.StatusOK
}

// waitDrainApplied waits until this edge's state shows the drain mark of id
// as asked (or the record gone), false when ctx ends first.
func waitDrainApplied(ctx context.Context, node *cluster.Node, id string, drain bool) bool {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if rec, ok := node.State().Instance(id); !ok || rec.Drained == drain {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// drainedSince is the log time of an instance's drain, nil when it is not
// drained.
func drainedSince(rec fsm.Instance) *time.Time {
	if !rec.Drained {
		return nil
	}
	t := time.Unix(0, rec.DrainedSince).UTC()
	return &t
}

// cutLast splits s around the last sep.
func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}
