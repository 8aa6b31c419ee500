package audit

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/tether-project/tether/fsm"
)

// LiveState is what verify asks of a running edge (ops/operator.Client
// implements it over the admin API).
type LiveState interface {
	// StateHash reports the edge's state index and hash. With index > 0
	// the edge first waits (briefly) until it has applied index; it still
	// reports its current state, which may be past index.
	StateHash(ctx context.Context, index uint64) (LiveHash, error)
	// Binding reports the edge's current binding of (fleet, key).
	Binding(ctx context.Context, fleet fsm.Fleet, key string) (LiveBinding, bool, error)
}

// LiveHash is an edge's state index and hash (hex).
type LiveHash struct {
	NodeID string
	Index  uint64
	Hash   string
}

// LiveBinding is the part of an edge's binding verify compares.
type LiveBinding struct {
	Instance string
	Epoch    uint64
	BoundAt  time.Time
}

// VerifyOptions tune Verify.
type VerifyOptions struct {
	Replay ReplayOptions
	// SpotCheck is how many bindings are compared one by one when the edge
	// has moved past the copy and cannot report a hash at the copy's index
	// (default 1000).
	SpotCheck int
}

// VerifyReport is the outcome of Verify.
type VerifyReport struct {
	OK bool
	// Mode is "hash" (state hashes compared at Index) or "bindings" (the
	// edge moved on: bindings compared one by one).
	Mode       string
	Index      uint64 // the replay's state index
	ReplayHash string
	LiveIndex  uint64
	LiveHash   string
	NodeID     string
	// Spot check figures (Mode "bindings").
	Checked, Equal, ChangedSince, Conflicts int
	Details                                 []string
	// Message is the verdict in words.
	Message string
	Replay  *Result
}

// Verify replays the copy and compares its state with the live edge's: the
// state hash at the copy's last index when the edge is (or can wait to be)
// at that index; otherwise, because the admin API reports only the current
// hash, the replayed bindings one by one (a binding the edge holds with an
// epoch at or below the copy's index must be identical; one it evicted or
// re-placed later is counted as changed since). The report says which.
func Verify(ctx context.Context, d *DataDir, live LiveState, opts VerifyOptions) (*VerifyReport, error) {
	if opts.SpotCheck <= 0 {
		opts.SpotCheck = 1000
	}
	res, err := d.Replay(ctx, opts.Replay)
	if err != nil {
		return nil, err
	}
	rep := &VerifyReport{Index: res.Index, ReplayHash: res.HashHex(), Replay: res}
	lh, err := live.StateHash(ctx, 0)
	if err != nil {
		return nil, fmt.Errorf("audit: verify: %w", err)
	}
	if lh.Index < res.Index {
		waited, err := live.StateHash(ctx, res.Index)
		if err != nil {
			return nil, fmt.Errorf("audit: verify: edge %s is at index %d, behind the copy's %d, and did not catch up (is it the cluster the copy came from?): %w",
				lh.NodeID, lh.Index, res.Index, err)
		}
		lh = waited
	}
	if lh.Index > res.Index {
		// An edge that still remembers the hash at the copy's index
		// answers it exactly (cluster.Node.HashAt); one that does not
		// answers its current state again.
		if at, err := live.StateHash(ctx, res.Index); err == nil && at.Index == res.Index {
			lh = at
		}
	}
	rep.LiveIndex, rep.LiveHash, rep.NodeID = lh.Index, strings.ToLower(lh.Hash), lh.NodeID
	switch {
	case lh.Index == res.Index:
		rep.Mode = "hash"
		rep.OK = rep.LiveHash == rep.ReplayHash
		if rep.OK {
			rep.Message = fmt.Sprintf("OK: state hash at index %d matches edge %s: %s", res.Index, lh.NodeID, rep.ReplayHash)
		} else {
			rep.Message = fmt.Sprintf("MISMATCH at index %d: the replay of the copy gives %s, edge %s reports %s",
				res.Index, rep.ReplayHash, lh.NodeID, rep.LiveHash)
			if res.MismatchCount > 0 {
				rep.Message += fmt.Sprintf("; the replay also disagrees with %d archived outcomes, first: %s", res.MismatchCount, res.Mismatches[0])
			}
		}
	case lh.Index < res.Index:
		rep.Mode = "none"
		rep.Message = fmt.Sprintf("NOT COMPARED: edge %s is at index %d, behind the copy's last index %d (is it the node the copy came from, and caught up?)",
			lh.NodeID, lh.Index, res.Index)
	default:
		rep.Mode = "bindings"
		if err := spotCheck(ctx, rep, res.State, live, opts.SpotCheck); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

func spotCheck(ctx context.Context, rep *VerifyReport, st *fsm.State, live LiveState, limit int) error {
	var firstErr error
	st.ForEachBinding(func(b fsm.Binding) bool {
		if rep.Checked >= limit {
			return false
		}
		lb, found, err := live.Binding(ctx, b.Fleet, b.Key)
		if err != nil {
			firstErr = fmt.Errorf("audit: verify: binding %s/%q: %w", b.Fleet, b.Key, err)
			return false
		}
		rep.Checked++
		switch {
		case !found || st.EpochIndex(lb.Epoch) > rep.Index: // placed after the copy (epochs are not indexes at level 2)
			rep.ChangedSince++
		case lb.Epoch == b.Epoch && lb.Instance == b.Instance && (lb.BoundAt.IsZero() || lb.BoundAt.UnixNano() == b.BoundAt):
			rep.Equal++
		default:
			rep.Conflicts++
			if len(rep.Details) < 20 {
				rep.Details = append(rep.Details, fmt.Sprintf("%s/%q: the copy has %s epoch %d, the edge %s epoch %d",
					b.Fleet, b.Key, b.Instance, b.Epoch, lb.Instance, lb.Epoch))
			}
		}
		return true
	})
	if firstErr != nil {
		return firstErr
	}
	rep.OK = rep.Conflicts == 0
	what := fmt.Sprintf("edge %s is at index %d, past the copy's last index %d, and no longer remembers the state hash at that index, "+
		"so the hashes cannot be compared; compared instead %d bindings of the replayed state with the edge's: %d identical, %d changed after index %d, %d conflicting",
		rep.NodeID, rep.LiveIndex, rep.Index, rep.Checked, rep.Equal, rep.ChangedSince, rep.Index, rep.Conflicts)
	if rep.OK {
		rep.Message = "PARTIAL OK: " + what
	} else {
		rep.Message = "MISMATCH: " + what + ": " + strings.Join(rep.Details, "; ")
	}
	return nil
}
