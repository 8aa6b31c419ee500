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
		kills    killTimes
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
	// Every Messages turn is judged after the run by what its edge knew
	// (test/routecheck): both hops against the placement in force at the
	// state index each decision read.
	var judged []judgedTurn
	messages := func(rng *rand.Rand, c int) {
		session := fmt.Sprintf("cc-session-%d", c)
		hdr := map[string]string{"x-claude-code-session-id": session, "anthropic-version": "2023-06-01"}
		history := []any{}
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
			mu.Lock()
			judged = append(judged, judgedTurn{key: session, reply: r, start: start, end: time.Now()})
			mu.Unlock()
			history = append(history, map[string]any{"role": "assistant", "content": "ok"})
			done.Add(1)
		}
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
					kills.mark(n.ID)
					n.Kill()
					killed = append(killed, n)
				}
			default:
				if l := st.Leader(); l != nil {
					t.Logf("nemesis: killing the leader %s after %d of %d turns", l.ID, done.Load(), total)
					kills.mark(l.ID)
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
	vd := judgeMessagesTurns(t, st, judged, &kills)
	t.Logf("FIGURES agent APIs across edges: %d conversations x %d turns per API, %d turns done, %d requests naming a stored response (0 not found allowed), %d retried (killed edge or election), Messages hops %s, %d failures",
		load.conversations, load.turns, done.Load(), byID.Load(), retried.Load(), vd, len(failures))
	if vd.Wrong != 0 {
		t.Errorf("%d Messages hops wrong by what their edge knew: %v", vd.Wrong, vd.Reports)
	}
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

// judgedTurn is one answered Messages turn of a session.
type judgedTurn struct {
	key        string
	reply      reply
	start, end time.Time
}

// killTimes records when each edge was killed.
type killTimes struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (k *killTimes) mark(id string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.at == nil {
		k.at = map[string][]time.Time{}
	}
	k.at[id] = append(k.at[id], time.Now())
}

// after reports whether edge id was killed at or after t.
func (k *killTimes) after(id string, t time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, at := range k.at[id] {
		if !at.Before(t) {
			return true
		}
	}
	return false
}

// judgeMessagesTurns judges both hops of every Messages turn with zero
// margin (test/routecheck), once every running edge's Bind proposals are
// answered, against the histories a running edge's archive holds. A new
// placement whose Bind never reached the log is excused only for an edge
// killed after the turn began.
func judgeMessagesTurns(t *testing.T, st *devstack.Stack, turns []judgedTurn, kills *killTimes) routecheck.Verdict {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var reader *devstack.EdgeNode
	waitfor.True(t, 30*time.Second, "every running edge's Bind proposals answered", func() bool {
		for _, n := range st.Edges() {
			if !n.Running() {
				continue
			}
			ci, err := n.Cluster(ctx)
			if err != nil || ci.DegradedPending != 0 {
				return false
			}
			reader = n
		}
		return reader != nil
	})
	hist := map[string][]routecheck.Event{}
	history := func(fleet, key string) []routecheck.Event {
		k := fleet + "/" + key
		if h, ok := hist[k]; ok {
			return h
		}
		var h routecheck.History
		waitfor.True(t, 20*time.Second, "the archived history of "+k, func() bool {
			h = routecheck.History{}
			return reader.AdminGet(ctx, "bindings/"+k+"/history", &h) == nil && !h.ArchiveBehind
		})
		hist[k] = h.Events
		return h.Events
	}
	var vd routecheck.Verdict
	for _, tr := range turns {
		r := routecheck.ParseRoute(tr.reply.header.Get(edge.HeaderRoute))
		if r.RequestID == "" || !r.HasState {
			t.Errorf("%s: x-tether-route %q carries no route evidence", tr.key, tr.reply.header.Get(edge.HeaderRoute))
			continue
		}
		edgeID := routecheck.EdgeOfRequest(r.RequestID)
		for _, hop := range []struct {
			fleet, inst string
			state       uint64
		}{{"context", r.Context, r.ContextState}, {"generation", r.Generation, r.GenerationState}} {
			if hop.inst == "" || hop.inst == "-" {
				continue
			}
			a := routecheck.Answer{Fleet: hop.fleet, Key: tr.key, Instance: hop.inst, Edge: edgeID, RequestID: r.RequestID,
				State: hop.state, Start: tr.start, End: tr.end, PromptTokens: messagesPrompt(tr.reply.body)}
			vd.Judge(a, history(hop.fleet, tr.key), kills.after(edgeID, tr.start))
		}
	}
	return vd
}

// messagesPrompt is a Messages answer's prompt as its usage counts it
// (input_tokens with the cache reads and writes), from the JSON body or a
// stream's message_start.
func messagesPrompt(body []byte) int {
	type usage struct {
		Input         int `json:"input_tokens"`
		CacheRead     int `json:"cache_read_input_tokens"`
		CacheCreation int `json:"cache_creation_input_tokens"`
	}
	sum := func(u usage) int { return u.Input + u.CacheRead + u.CacheCreation }
	var m struct {
		Usage usage `json:"usage"`
	}
	if json.Unmarshal(body, &m) == nil {
		return sum(m.Usage)
	}
	evs, _ := eventsOf(body)
	for _, ev := range evs {
		if ev.name != "message_start" {
			continue
		}
		b, _ := json.Marshal(ev.data["message"])
		if json.Unmarshal(b, &m) == nil {
			return sum(m.Usage)
		}
	}
	return 0
}
