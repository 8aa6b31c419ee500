package agentapi

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/respid"
	"github.com/tether-project/tether/ops/devstack"
	"github.com/tether-project/tether/test/routecheck"
	"github.com/tether-project/tether/test/waitfor"
)

// longMode: the soak's long form (make soak sets RELIABILITY_LONG=1).
func longMode() bool { return os.Getenv("RELIABILITY_LONG") == "1" }

// agentLoad is one run's shape.
type agentLoad struct {
	conversations, turns, workers int
	nemesis                       time.Duration // between nemesis steps from the start (0: one leader kill halfway)
	timeScale                     float64       // the simulated engine's (0: instant)
}

// Conversations of both agent APIs through 3 voting and 2 non-voting
// edges (real Raft, the shipped defaults), every turn sent to a random
// edge the instant the previous one completed, a leader kill in the
// middle. Responses conversations chain every turn by previous_response_id
// (streamed and not) and read every response back through another random
// edge: no "not found", and every request naming a response is served by
// the instance that made it (the x-tether-route of the answer, and the
// instance the id names: only that process can answer it). Every turn of
// a Messages conversation (x-claude-code-session-id) is judged with zero
// margin against the log (judgeMessages). Long form (RELIABILITY_LONG=1, make soak): 100 + 100
// conversations and a nemesis every few seconds (kill the leader, kill a
// non-voter, restart what was killed).
func TestAgentAPIsAcrossEdges(t *testing.T) {
	load := agentLoad{conversations: 8, turns: 8, workers: 4}
	if longMode() {
		load = agentLoad{conversations: 100, turns: 8, workers: 16, nemesis: 2 * time.Second, timeScale: 0.05}
	}
	voters := 3
	st := startStack(t, devstack.Options{Edges: 5, TimeScale: load.timeScale, EdgeConfig: func(i int, c *edge.Config) {
		c.Cluster.Peers = c.Cluster.Peers[:voters]
		if i >= voters {
			c.Cluster.Suffrage = "nonvoter"
			c.Cluster.Bootstrap = false
			c.Cluster.Join = []string{c.Cluster.Peers[0].Addr}
		}
	}})
	edges := st.Edges()
	model := st.Model()
	var (
		mu       sync.Mutex
		failures []string
		done     atomic.Int64
		byID     atomic.Int64 // requests naming a stored response
		retried  atomic.Int64
		killed   []*devstack.EdgeNode
		// killedAt: when the nemesis killed each edge; msgTurns: each
		// Messages conversation's answered turns (both under mu).
		killedAt = map[string][]time.Time{}
		msgTurns = map[string][]msgTurn{}
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(failures) < 20 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	failed := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(failures) > 0
	}
	// send retries a request the deployment could not take (a killed
	// edge, an election's 503 with Retry-After) on another running edge,
	// as a client with a load balancer would; any other answer is judged.
	send := func(rng *rand.Rand, method, path string, body any, hdr map[string]string, avoid string) (reply, string) {
		for attempt := 0; ; attempt++ {
			running := []*devstack.EdgeNode{}
			for _, n := range edges {
				if n.Running() && n.ID != avoid {
					running = append(running, n)
				}
			}
			n := running[rng.IntN(len(running))]
			r, err := try(method, n.URL()+path, body, hdr)
			if err == nil && r.status != http.StatusServiceUnavailable && r.status != http.StatusBadGateway {
				return r, n.ID
			}
			if attempt >= 40 {
				if err != nil {
					return reply{status: -1, body: []byte(err.Error())}, n.ID
				}
				return r, n.ID
			}
			retried.Add(1)
			time.Sleep(50 * time.Millisecond)
		}
	}
	responses := func(rng *rand.Rand, c int) {
		conv := ""
		if c%2 == 1 {
			conv = fmt.Sprintf("codex-thread-%d", c) // Codex's prompt_cache_key; even ones name no conversation
		}
		prev, prevInst := "", ""
		instr := fmt.Sprintf("agent %d. %s", c, words("inst", 80))
		for turn := 0; turn < load.turns; turn++ {
			body := map[string]any{"model": model, "instructions": instr, "input": fmt.Sprintf("c%d turn %d", c, turn), "max_output_tokens": 4, "stream": turn%2 == 1}
			if conv != "" {
				body["prompt_cache_key"] = conv
			}
			if prev != "" {
				body["previous_response_id"] = prev
				byID.Add(1)
			}
			r, via := send(rng, "POST", "/v1/responses", body, nil, "")
			if r.status != 200 {
				fail("responses c%d turn %d via %s: %d %s", c, turn, via, r.status, r.body)
				return
			}
			_, gen := routeOf(r)
			if prev != "" && gen != prevInst {
				fail("responses c%d turn %d via %s: served by %s, the previous response is stored on %s", c, turn, via, gen, prevInst)
			}
			var o respObj
			if turn%2 == 1 {
				evs, err := eventsOf(r.body)
				if err != nil || !lastEventOfStatus(evs) {
					fail("responses c%d turn %d: stream %v does not end with the event of its status (response.completed or response.incomplete): %s", c, turn, err, r.body)
					return
				}
				b, _ := json.Marshal(evs[len(evs)-1].data["response"])
				_ = json.Unmarshal(b, &o)
			} else if err := json.Unmarshal(r.body, &o); err != nil {
				fail("responses c%d turn %d: %v: %s", c, turn, err, r.body)
				return
			}
			id, err := respid.Decode(o.ID)
			if err != nil || id.Instance != gen || fsm.Fleet(id.Fleet) != fsm.FleetGeneration {
				fail("responses c%d turn %d: id %q (%+v, %v) does not name the instance %s that served it", c, turn, o.ID, id, err, gen)
			}
			// Read it back through another edge.
			byID.Add(1)
			g, gvia := send(rng, "GET", "/v1/responses/"+o.ID, nil, nil, via)
			var back respObj
			if g.status != 200 || json.Unmarshal(g.body, &back) != nil || back.ID != o.ID {
				fail("GET c%d turn %d via %s: %d %s", c, turn, gvia, g.status, g.body)
			} else if _, ggen := routeOf(g); ggen != gen {
				fail("GET c%d turn %d via %s: answered by %s, stored on %s", c, turn, gvia, ggen, gen)
			}
			prev, prevInst = o.ID, gen
			done.Add(1)
		}
	}
	messages := func(rng *rand.Rand, c int) {
		session := fmt.Sprintf("cc-session-%d", c)
		hdr := map[string]string{"x-claude-code-session-id": session, "anthropic-version": "2023-06-01"}
		history := []any{}
		turns := make([]msgTurn, 0, load.turns)
		for turn := 0; turn < load.turns; turn++ {
			history = append(history, map[string]any{"role": "user", "content": fmt.Sprintf("c%d turn %d", c, turn)})
			body := map[string]any{"model": model, "max_tokens": 4, "system": fmt.Sprintf("cc %d %s", c, words("sys", 80)),
				"messages": history, "stream": turn%2 == 0}
			start := time.Now()
			r, via := send(rng, "POST", "/v1/messages", body, hdr, "")
			if r.status != 200 {
				fail("messages c%d turn %d via %s: %d %s", c, turn, via, r.status, r.body)
				return
			}
			turns = append(turns, msgTurn{n: turn, via: via, route: r.header.Get(edge.HeaderRoute), start: start, end: time.Now()})
			history = append(history, map[string]any{"role": "assistant", "content": "ok"})
			done.Add(1)
		}
		mu.Lock()
		msgTurns[session] = turns
		mu.Unlock()
	}

	total := int64(2 * load.conversations * load.turns)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := range load.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for j := range jobs {
				if j%2 == 0 {
					responses(rng, j/2)
				} else {
					messages(rng, j/2)
				}
			}
		}()
	}
	nemesisDone, workersDone := make(chan struct{}), make(chan struct{})
	finished := func() bool {
		select {
		case <-workersDone:
			return true
		default:
			return false
		}
	}
	go func() {
		defer close(nemesisDone)
		step := 0
		for load.nemesis == 0 && done.Load() < total/2 && !failed() && !finished() {
			time.Sleep(5 * time.Millisecond)
		}
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			switch {
			case step%3 == 2 && len(killed) > 0:
				for _, n := range killed {
					t.Logf("nemesis: restarting %s after %d of %d turns", n.ID, done.Load(), total)
					if err := n.Restart(ctx); err != nil {
						fail("restart %s: %v", n.ID, err)
					}
				}
				killed = nil
			case step%3 == 1:
				if n := edges[voters+step%2]; n.Running() {
					t.Logf("nemesis: killing the non-voter %s after %d of %d turns", n.ID, done.Load(), total)
					mu.Lock()
					killedAt[n.ID] = append(killedAt[n.ID], time.Now())
					mu.Unlock()
					n.Kill()
					killed = append(killed, n)
				}
			default:
				if l := st.Leader(); l != nil {
					t.Logf("nemesis: killing the leader %s after %d of %d turns", l.ID, done.Load(), total)
					mu.Lock()
					killedAt[l.ID] = append(killedAt[l.ID], time.Now())
					mu.Unlock()
					l.Kill()
					killed = append(killed, l)
				}
			}
			cancel()
			step++
			if load.nemesis == 0 {
				return
			}
			deadline := time.Now().Add(load.nemesis)
			for time.Now().Before(deadline) && !finished() {
				time.Sleep(10 * time.Millisecond)
			}
			if finished() {
				return
			}
		}
	}()
	for j := range 2 * load.conversations {
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	close(workersDone)
	<-nemesisDone
	verdict := judgeMessages(t, edges, msgTurns, killedAt)
	t.Logf("FIGURES agent APIs across edges: %d conversations x %d turns per API, %d turns done, %d requests naming a stored response (0 not found allowed), %d retried (killed edge or election), Messages turns judged with zero margin: %s, %d failures",
		load.conversations, load.turns, done.Load(), byID.Load(), retried.Load(), verdict, len(failures))
	for _, f := range failures {
		t.Error(f)
	}
	if done.Load() != total {
		t.Fatalf("%d of %d turns done", done.Load(), total)
	}
	// Restart what the nemesis left killed, so the stack closes whole.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range killed {
		_ = n.Restart(ctx)
	}
}

// msgTurn is one answered turn of a Messages conversation.
type msgTurn struct {
	n          int
	via        string
	route      string // x-tether-route
	start, end time.Time
}

// judgeMessages judges the context hop of every Messages turn with zero
// margin (test/routecheck), against the key's history a running edge's
// archive holds once the running edges' Bind proposals are answered: a
// turn is served on the placement in force at the state its edge's
// decision read, on a detour or placement the request itself committed,
// or on its edge's own proposal for a key unbound there. A placement that
// never reached the log is excused only when its edge was killed after the
// turn began. Elections and telemetry late on a busy machine make edges
// place, detour and follow other edges' placements; the log says which.
func judgeMessages(t *testing.T, edges []*devstack.EdgeNode, convs map[string][]msgTurn, killedAt map[string][]time.Time) routecheck.Verdict {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var reader *devstack.EdgeNode
	for _, n := range edges {
		if n.Running() {
			reader = n
			break
		}
	}
	if reader == nil {
		t.Fatal("no running edge to read the log from")
	}
	waitfor.True(t, 30*time.Second, "the running edges' Bind proposals answered", func() bool {
		for _, n := range edges {
			if !n.Running() {
				continue
			}
			if ci, err := n.Cluster(ctx); err != nil || ci.DegradedPending != 0 {
				return false
			}
		}
		return true
	})
	killedSince := func(id string, start time.Time) bool {
		for _, at := range killedAt[id] {
			if !at.Before(start) {
				return true
			}
		}
		return false
	}
	var v routecheck.Verdict
	for key, turns := range convs {
		var h routecheck.History
		waitfor.True(t, 20*time.Second, "the archived history of context/"+key, func() bool {
			h = routecheck.History{}
			return reader.AdminGet(ctx, "bindings/context/"+key+"/history", &h) == nil && !h.ArchiveBehind
		})
		for _, tr := range turns {
			r := routecheck.ParseRoute(tr.route)
			if r.RequestID == "" || !r.HasState {
				t.Errorf("%s turn %d via %s: x-tether-route %q carries no route evidence", key, tr.n, tr.via, tr.route)
				continue
			}
			a := routecheck.Answer{Fleet: "context", Key: key, Instance: r.Context, Edge: routecheck.EdgeOfRequest(r.RequestID),
				RequestID: r.RequestID, State: r.ContextState, Start: tr.start, End: tr.end}
			k, why := routecheck.Judge(a, h.Events)
			if why != "" {
				why = fmt.Sprintf("messages %s turn %d via %s: %s", key, tr.n, tr.via, why)
			}
			v.Add(k, why, killedSince(a.Edge, tr.start))
		}
	}
	for _, r := range v.Reports {
		t.Errorf("wrong answer: %s", r)
	}
	return v
}
