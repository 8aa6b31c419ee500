package edge

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/natstest"
)

// A bound conversation whose context instance evicted its blocks moves to
// the instance that holds its system prompt: an Overflow with Rebind,
// reason cache_lost (circuit_open while the cluster runs feature level 1),
// and the following turns stay there. The generation binding does not move.
func TestCacheLostRebind(t *testing.T) {
	for _, level := range []uint32{0, 1} {
		name, want := "level 2", fsm.OverflowCacheLost
		if level == 1 {
			name, want = "level 1", fsm.OverflowCircuitOpen
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ns := natstest.Start(t, nil)
			ctx := map[string]*testWorker{}
			for _, id := range []string{"ctx-0", "ctx-1"} {
				ctx[id] = startWorker(t, id, workerOpts{fleet: telemetry.FleetContext, role: hintauth.RoleContext, nats: ns.ClientURL(), capacityBlocks: 256})
			}
			startWorker(t, "gen-0", workerOpts{fleet: telemetry.FleetGeneration, role: hintauth.RoleGeneration, nats: ns.ClientURL()})
			ec := startEdges(t, 1, ns.ClientURL(), func(_ int, c *Config) {
				c.Cluster.FeatureLevel = level
				// The test waits for the index to show the eviction itself,
				// so the binding need not sit idle first.
				c.Placement.Overflow.CacheLostMinIdle = 0
			})
			ec.waitInstances(3)
			te, c := ec.edge(0), httpClient(t)
			ix := te.e.fleet.Index()

			a := &agent{session: "lost", system: longText("lost-system", 40)}
			first := a.send(t, c, te, "one", nil)
			x, y := first.ctxInst, "ctx-0"
			if x == y {
				y = "ctx-1"
			}
			_, tokens, _ := mustParse(t, chatBody(t, a.system, append(append([]string(nil), a.turns...), "two"), nil))
			blocks := prefix.BlockHashes(tokens, te.cfg.Placement.BlockSize)

			// Evict the conversation on x with unrelated prompts sent to
			// the worker directly, until the edge's index says x holds
			// none of it.
			n := 0
			waitFor(t, x+" to evict the conversation", 20*time.Second, func() bool {
				if held, synced := ix.Holds(x, -1, blocks[0], te.e.now()); synced && !held {
					return true
				}
				for range 4 {
					n++
					direct(t, c, ctx[x], longText(fmt.Sprintf("flood-%d", n), 150), "flood")
				}
				return false
			})
			// y holds the system prompt (another conversation's turn).
			direct(t, c, ctx[y], a.system, "another conversation")
			waitFor(t, y+" to report the system prompt", 10*time.Second, func() bool {
				held, synced := ix.Holds(y, -1, blocks[0], te.e.now())
				return synced && held
			})

			second := a.send(t, c, te, "two", nil)
			if second.ctxInst != y {
				t.Fatalf("turn 2 on %s, want %s (it holds the system prompt; %s lost the conversation)", second.ctxInst, y, x)
			}
			// The edge records the overflow off the request path.
			waitFor(t, "the binding to move to "+y, 10*time.Second, func() bool {
				b, ok := te.e.Node().State().Lookup(fsm.FleetContext, a.session)
				return ok && b.Instance == y
			})
			st := te.e.Node().State()
			if got := st.Counters().Overflows[want]; got != 1 {
				t.Fatalf("overflows by reason %v: %d of %v, want 1", st.Counters().Overflows, got, want)
			}
			if b, ok := st.Lookup(fsm.FleetGeneration, a.session); !ok || b.Instance != first.gen {
				t.Fatalf("generation binding %+v, want it kept on %s", b, first.gen)
			}
			third := a.send(t, c, te, "three", nil)
			if third.ctxInst != y || third.cache == 0 {
				t.Fatalf("turn 3 on %s with %d cached tokens, want sticky on %s with a cache hit", third.ctxInst, third.cache, y)
			}
		})
	}
}

func mustParse(t testing.TB, body []byte) (*route.Request, []uint32, string) {
	t.Helper()
	rq, conv, tokens, aerr := parseBody(body, apireq.Chat)
	if aerr != nil {
		t.Fatalf("parse: %v", aerr)
	}
	return rq, tokens, conv
}

var directSeq atomic.Uint64

// direct sends a context-only request to a worker, bypassing the edge.
func direct(t testing.TB, c *http.Client, w *testWorker, system, user string) {
	t.Helper()
	id := fmt.Sprintf("direct-%d", directSeq.Add(1))
	body := chatBody(t, system, []string{user}, map[string]any{"disaggregated_params": map[string]any{"request_type": "context_only", "disagg_request_id": id}})
	if r := do(t, c, http.MethodPost, w.proxy.URL+"/v1/chat/completions", body, nil); r.status != http.StatusOK {
		t.Fatalf("direct request to %s: %d %s", w.id, r.status, r.body)
	}
}
