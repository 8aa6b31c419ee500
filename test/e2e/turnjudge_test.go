package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tether-project/tether/ops/devstack"
	"github.com/tether-project/tether/test/routecheck"
	"github.com/tether-project/tether/test/waitfor"
)

// answeredTurn is one answered turn of a conversation: what the edge said
// in x-tether-route and when the client sent and received it.
type answeredTurn struct {
	n          int // 1-based
	tr         turn
	start, end time.Time
}

// judgeTurns judges every answered turn of the conversation key, both
// hops, with zero margin (test/routecheck) against the key's context and
// generation histories: on the placement in force in the state the
// answering edge had applied, or on a placement of its own the log
// recorded (its request's Bind, or its edge's Bind in flight for a key
// unbound there). A turn that reaches an edge before that edge has applied
// the key's Bind or heard where another edge placed it may be placed anew
// there (soft affinity: the first committed Bind decides, and the racing
// turn costs at most its own cache hit), so a turn is not judged against
// the conversation's first turn. An answer whose new placement never
// reached the log is excused only when its edge is killed (with its
// proposals in flight) at or after the turn began.
func judgeTurns(key string, turns []answeredTurn, hist map[string][]routecheck.Event, killed string, killedAt time.Time) (routecheck.Verdict, error) {
	var v routecheck.Verdict
	for _, at := range turns {
		r := routecheck.ParseRoute(at.tr.route)
		if r.RequestID == "" || !r.HasState {
			return v, fmt.Errorf("%s turn %d: x-tether-route %q carries no route evidence", key, at.n, at.tr.route)
		}
		edgeID := routecheck.EdgeOfRequest(r.RequestID)
		for _, h := range []struct {
			fleet, inst string
			state       uint64
		}{{"context", r.Context, r.ContextState}, {"generation", r.Generation, r.GenerationState}} {
			a := routecheck.Answer{Fleet: h.fleet, Key: key, Instance: h.inst, Edge: edgeID, RequestID: r.RequestID,
				State: h.state, Start: at.start, End: at.end, PromptTokens: at.tr.prompt}
			var one routecheck.Verdict
			if _, why := one.Judge(a, hist[h.fleet], edgeID == killed && !killedAt.Before(at.start)); len(one.Reports) > 0 {
				one.Reports = []string{fmt.Sprintf("turn %d via %s: %s", at.n, at.tr.via, why)}
			}
			v.Merge(one)
		}
	}
	return v, nil
}

// judgeConversations judges every conversation's turns (judgeTurns) once
// the surviving edges' Bind proposals are answered, against the histories
// a survivor's archive holds.
func judgeConversations(ctx context.Context, t *testing.T, st *devstack.Stack, survivors []*devstack.EdgeNode,
	convs map[string][]answeredTurn, killed string, killedAt time.Time) {
	t.Helper()
	waitfor.True(t, 30*time.Second, "the surviving edges' Bind proposals answered", func() bool {
		for _, s := range survivors {
			ci, err := s.Cluster(ctx)
			if err != nil || ci.DegradedPending != 0 {
				return false
			}
		}
		return true
	})
	reader := survivors[0]
	var total routecheck.Verdict
	for key, turns := range convs {
		hist := map[string][]routecheck.Event{}
		for _, f := range []string{"context", "generation"} {
			var h routecheck.History
			waitfor.True(t, 20*time.Second, "the archived history of "+f+"/"+key, func() bool {
				h = routecheck.History{}
				return reader.AdminGet(ctx, "bindings/"+f+"/"+key+"/history", &h) == nil && !h.ArchiveBehind
			})
			hist[f] = h.Events
		}
		v, err := judgeTurns(key, turns, hist, killed, killedAt)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range v.Reports {
			t.Errorf("%s: wrong answer: %s", key, r)
		}
		if v.Wrong != 0 {
			t.Errorf("%s: %s", key, diagnose(ctx, st, key))
		}
		total.Merge(v)
	}
	t.Logf("turns judged with zero margin: %s", total)
}
