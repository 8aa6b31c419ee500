package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/test/routecheck"
)

// sample is one client request.
type sample struct {
	root, conv string
	edge       string
	start, end time.Time
	route      routecheck.Route // x-tether-route of the answer
	prompt     int              // the answer's usage.prompt_tokens
	ok         bool
	lastErr    string // of the last failed attempt
}

// load drives conversations with sub-agents through the running edges until
// stopped; a failed request is retried on another edge (as a client behind
// a load balancer would).
type load struct {
	v       *env
	prefix  string
	rng     *rand.Rand
	client  *http.Client
	mu      sync.Mutex
	samples []sample
	sent    atomic.Int64
	retried atomic.Int64
	failed  atomic.Int64
	// refused counts attempts answered 503 (each retried on another edge).
	refused atomic.Int64
	// refusals counts non-200 attempts by status and error code (under mu).
	refusals map[string]int
	stop     chan struct{}
	wg       sync.WaitGroup
}

func startLoad(v *env, prefix string, conversations, workers int) *load {
	tr := v.transport(workers)
	l := &load{v: v, prefix: prefix, rng: rand.New(rand.NewSource(time.Now().UnixNano())),
		client: &http.Client{Transport: tr, Timeout: 2 * time.Second}, stop: make(chan struct{})}
	type conv struct{ root, conv, parent string }
	var convs []conv
	for i := range conversations {
		root := fmt.Sprintf("%s-%d", prefix, i)
		convs = append(convs, conv{root, root, ""})
		for j := range 2 {
			convs = append(convs, conv{root, fmt.Sprintf("%s-sub%d", root, j), root})
		}
	}
	for w := range workers {
		rng := rand.New(rand.NewSource(int64(w) + time.Now().UnixNano()))
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for turn := 0; ; turn++ {
				for i := w; i < len(convs); i += workers {
					select {
					case <-l.stop:
						return
					default:
					}
					c := convs[i]
					l.request(rng, c.root, c.conv, c.parent, turn)
				}
			}
		}()
	}
	return l
}

// startSessions drives short sessions until stopped: each client runs
// conversations of turns requests (a parent, its turns sent to random
// edges), then starts a new one, so new keys keep arriving.
func startSessions(v *env, prefix string, clients, turns int) *load {
	tr := v.transport(clients)
	l := &load{v: v, prefix: prefix, rng: rand.New(rand.NewSource(time.Now().UnixNano())),
		client: &http.Client{Transport: tr, Timeout: 2 * time.Second}, stop: make(chan struct{})}
	for w := range clients {
		rng := rand.New(rand.NewSource(int64(w) + time.Now().UnixNano()))
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for n := 0; ; n++ {
				conv := fmt.Sprintf("%s-%d-%d", prefix, w, n)
				for turn := range turns {
					select {
					case <-l.stop:
						return
					default:
					}
					l.request(rng, conv, conv, "", turn)
				}
			}
		}()
	}
	return l
}

func (l *load) request(rng *rand.Rand, root, conv, parent string, turn int) {
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 2,
		"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("%s turn %d", conv, turn)}}})
	s := sample{root: root, conv: conv, start: time.Now()}
	edges := l.v.edges
	first := rng.Intn(len(edges))
	for attempt := 0; attempt < 6 && !s.ok; attempt++ {
		e := edges[(first+attempt)%len(edges)]
		l.sent.Add(1)
		if attempt > 0 {
			l.retried.Add(1)
		}
		req, _ := http.NewRequest("POST", e.url()+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-session-id", conv)
		if parent != "" {
			req.Header.Set(parentHdr, parent)
		}
		resp, err := l.client.Do(req)
		if err != nil {
			s.lastErr = "transport: " + errClass(err)
			if attempt%len(edges) == len(edges)-1 {
				time.Sleep(200 * time.Millisecond) // a whole round failed: client back-off
			}
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			if resp.StatusCode == http.StatusServiceUnavailable {
				l.refused.Add(1)
			}
			var e struct {
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			_ = json.Unmarshal(b, &e)
			s.lastErr = fmt.Sprintf("HTTP %d %s", resp.StatusCode, e.Error.Code)
			l.mu.Lock()
			if l.refusals == nil {
				l.refusals = map[string]int{}
			}
			l.refusals[s.lastErr]++
			l.mu.Unlock()
			// As an OpenAI SDK would: wait what the edge asks
			// (retry-after-ms; an election's worth when it cannot place a
			// key), or pause after a whole round of refusals.
			if ms, err := strconv.Atoi(resp.Header.Get("Retry-After-Ms")); err == nil && ms > 0 {
				time.Sleep(min(time.Duration(ms)*time.Millisecond, time.Second)) // client back-off, not a wait-to-pass
			} else if attempt%len(edges) == len(edges)-1 {
				time.Sleep(200 * time.Millisecond)
			}
			continue
		}
		s.ok, s.edge = true, e.id
		s.route = routecheck.ParseRoute(resp.Header.Get("x-tether-route"))
		s.prompt = promptTokens(b)
	}
	s.end = time.Now()
	if !s.ok {
		l.failed.Add(1)
	}
	l.mu.Lock()
	l.samples = append(l.samples, s)
	l.mu.Unlock()
}

func (l *load) finish() []sample {
	close(l.stop)
	l.wg.Wait()
	l.client.Transport.(*http.Transport).CloseIdleConnections()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.samples
}

// promptTokens is the prompt size an answer's usage reports, in any of the
// APIs' shapes (chat's prompt_tokens; Messages' input_tokens plus its
// cache reads and writes; Responses' input_tokens), 0 when it has none.
func promptTokens(body []byte) int {
	var u struct {
		Usage struct {
			PromptTokens  int `json:"prompt_tokens"`
			InputTokens   int `json:"input_tokens"`
			CacheRead     int `json:"cache_read_input_tokens"`
			CacheCreation int `json:"cache_creation_input_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &u) != nil {
		return 0
	}
	return u.Usage.PromptTokens + u.Usage.InputTokens + u.Usage.CacheRead + u.Usage.CacheCreation
}

// errClass shortens a transport error to its kind.
func errClass(err error) string {
	msg := err.Error()
	for _, k := range []string{"Client.Timeout", "connection refused", "connection reset", "EOF"} {
		if strings.Contains(msg, k) {
			return k
		}
	}
	return msg
}

// failureReasons counts the last error of every failed request.
func failureReasons(samples []sample) map[string]int {
	out := map[string]int{}
	for _, s := range samples {
		if !s.ok {
			out[s.lastErr]++
		}
	}
	return out
}

// parseRoute reads x-tether-route's instances (edge.ParseRoute).
func parseRoute(h string) (ctxInst, genInst string) {
	r, _ := edge.ParseRoute(h)
	return r.ContextInstance, r.GenerationInstance
}

// leftBy names the last entry of a key's history: its type and, when it
// has one, its reason (an eviction's ttl, instance_down, kv_evicted …).
func leftBy(events []routecheck.Event) string {
	if len(events) == 0 {
		return "none"
	}
	last := events[len(events)-1]
	if r, ok := last.Event["reason"]; ok {
		return fmt.Sprintf("%s/%v", last.Type, r)
	}
	return last.Type
}

// history reads a key's archived history from e, once the archive holds
// everything e has applied.
func (v *env) history(e *edgeProc, fleet, key string) []routecheck.Event {
	v.t.Helper()
	var h routecheck.History
	waitFor(v.t, 20*time.Second, "the archived history of "+fleet+"/"+key, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h = routecheck.History{}
		return v.admin(ctx, e, "bindings/"+fleet+"/"+key+"/history", &h) == nil && !h.ArchiveBehind
	})
	return h.Events
}

type verdict struct {
	routecheck.Verdict
	lost, evicted int
	// evictedBy counts the evicted keys by the entry that removed each.
	evictedBy map[string]int
	// servedUnbound: acknowledged keys whose every answer was served on a
	// placement its killed edge never recorded (routecheck.ServedUnbound).
	servedUnbound int
}

// checkRoutes judges every answered request, both hops, with zero margin
// (test/routecheck): against the key's placement in the state the serving
// edge had applied when it decided, the detours and Binds the request
// itself committed, and — for a key unbound there — the edge's own Bind
// in flight. An answer whose new placement never reached the log is
// excused only when its edge was killed after the request began. It also
// checks that every acknowledged key is bound, or left with a recorded
// reason, or was only ever served on such excused placements
// (routecheck.AckedPlacement).
func (v *env) checkRoutes(samples []sample, restarts map[string][]time.Time) verdict {
	v.t.Helper()
	// Judged once the log has answered every edge's own proposals (a
	// restarted edge retries those its first attempt could not commit).
	waitFor(v.t, 30*time.Second, "every edge's Bind proposals answered", func() bool {
		for _, e := range v.edges {
			ci, err := v.cluster(e)
			if err != nil || ci.DegradedPending != 0 {
				return false
			}
		}
		return true
	})
	reader := v.waitLeader(20 * time.Second)
	var out verdict
	cache := map[string][]routecheck.Event{}
	get := func(fleet, key string) []routecheck.Event {
		k := fleet + "/" + key
		if h, ok := cache[k]; ok {
			return h
		}
		h := v.history(reader, fleet, key)
		cache[k] = h
		return h
	}
	killedAfter := func(edgeID string, t time.Time) bool {
		for _, r := range append(append([]time.Time(nil), restarts[edgeID]...), restarts["*"]...) {
			if r.After(t) {
				return true
			}
		}
		return false
	}
	acked := map[string]bool{}
	// Per acknowledged root: its context answers, and how many of them were
	// excused unrecorded ones.
	rootAnswers, rootUnrecorded := map[string]int{}, map[string]int{}
	for _, s := range samples {
		if !s.ok {
			continue
		}
		acked[s.root] = true
		ctxKey := s.root
		if s.route.ContextOwn {
			ctxKey = s.conv
		}
		for _, c := range []struct {
			fleet, key, inst string
			state            uint64
		}{{"context", ctxKey, s.route.Context, s.route.ContextState}, {"generation", s.conv, s.route.Generation, s.route.GenerationState}} {
			if c.inst == "" || c.inst == "-" {
				continue
			}
			a := routecheck.Answer{Fleet: c.fleet, Key: c.key, Instance: c.inst, Edge: s.edge,
				RequestID: s.route.RequestID, State: c.state, Start: s.start, End: s.end, PromptTokens: s.prompt}
			excused := killedAfter(s.edge, s.start)
			k, _ := out.Judge(a, get(c.fleet, c.key), excused)
			if c.fleet == "context" && c.key == s.root {
				rootAnswers[s.root]++
				if k == routecheck.Unrecorded && excused {
					rootUnrecorded[s.root]++
				}
			}
		}
	}
	for _, r := range out.Reports {
		v.t.Errorf("wrong answer: %s", r)
	}
	// No acknowledged binding lost: every key that got an answer is bound,
	// or its history records why it left, or every answer of it was served
	// on a placement an edge killed with its Bind in flight never recorded
	// (and no later request placed it again).
	for root := range acked {
		unrecordedOnly := rootAnswers[root] > 0 && rootUnrecorded[root] == rootAnswers[root]
		switch routecheck.AckedPlacement(get("context", root), unrecordedOnly) {
		case routecheck.Lost:
			out.lost++
			v.t.Errorf("context key %s was answered but the log has no placement for it (%d of its %d context answers excused as unrecorded after a kill)",
				root, rootUnrecorded[root], rootAnswers[root])
		case routecheck.ServedUnbound:
			out.servedUnbound++
		case routecheck.PlacedThenLeft:
			out.evicted++
			if out.evictedBy == nil {
				out.evictedBy = map[string]int{}
			}
			out.evictedBy[leftBy(get("context", root))]++
		}
	}
	return out
}

// nemesis is one fault with its expected outcome.
type nemesis struct {
	name   string
	expect string
	long   bool // only in long mode
	evicts bool // the fault legitimately evicts bindings
	// noUnhealthy: every worker stays up, so no request may fail for
	// want of a healthy instance.
	noUnhealthy bool
	run         func(t *testing.T, v *env, mark func(edgeID string))
}

var nemeses = []nemesis{
	{
		name:   "kill-leader",
		expect: "SIGKILL the leader edge: a new leader within seconds; clients retry on other edges; the killed edge restarts on its data dir and catches up; invariants hold",
		run: func(t *testing.T, v *env, mark func(string)) {
			l := v.waitLeader(20 * time.Second)
			mark("*")
			_ = l.stop(syscall.SIGKILL, time.Second)
			waitFor(t, 20*time.Second, "a new leader", func() bool { n := v.leader(); return n != nil && n != l })
			mark(l.id)
			l.start(t)
		},
	},
	{
		name:   "stop-cont-leader",
		expect: "SIGSTOP the leader for 3 s then SIGCONT: the others elect a leader; requests to the frozen edge time out and are retried elsewhere; on SIGCONT the old leader steps down and catches up",
		run: func(t *testing.T, v *env, mark func(string)) {
			l := v.waitLeader(20 * time.Second)
			mark("*")
			l.signal(syscall.SIGSTOP)
			waitFor(t, 20*time.Second, "a new leader while the old one is stopped", func() bool { n := v.leader(); return n != nil && n != l })
			time.Sleep(time.Second) // hold the fault (schedule, not a wait for a result)
			mark(l.id)
			l.signal(syscall.SIGCONT)
		},
	},
	{
		name:   "restart-follower",
		expect: "SIGTERM a follower and start it again on the same data dir: graceful close, restart from raft.db/snapshots, catches up",
		long:   true,
		run: func(t *testing.T, v *env, mark func(string)) {
			l := v.waitLeader(20 * time.Second)
			for _, e := range v.edges {
				if e != l {
					if err := e.stop(syscall.SIGTERM, 30*time.Second); err != nil {
						t.Errorf("graceful stop of %s: %v\n%s", e.id, err, e.tail(20))
					}
					mark(e.id)
					e.start(t)
					return
				}
			}
		},
	},
	{
		name:        "nats-outage",
		expect:      "the NATS server goes away for 3 s and comes back on the same port: the edges keep the workers' last known health and probe them over HTTP meanwhile, so requests keep being served; workers and edges reconnect; bound keys keep their instances; no binding is evicted for the outage",
		long:        true,
		noUnhealthy: true,
		run: func(t *testing.T, v *env, mark func(string)) {
			v.stopNATS()
			time.Sleep(3 * time.Second) // the outage (schedule)
			v.startNATS()
		},
	},
	{
		name:   "kill-worker",
		evicts: true,
		expect: "SIGKILL a context worker: after telemetry.down_after the leader records it down and its bindings are evicted (recorded); its keys are placed on the other worker (new epoch); restarted, it registers again",
		run: func(t *testing.T, v *env, mark func(string)) {
			w := v.workers[0]
			_ = w.stop(syscall.SIGKILL, time.Second)
			l := v.leader()
			var lastSeen any
			defer func() {
				if t.Failed() {
					t.Logf("last instances view: %v", lastSeen)
				}
			}()
			waitFor(t, 30*time.Second, "the killed worker recorded down", func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				var resp struct {
					Instances []map[string]any `json:"instances"`
				}
				if l == nil || v.admin(ctx, l, "instances", &resp) != nil {
					l = v.leader()
					return false
				}
				lastSeen = resp.Instances
				for _, in := range resp.Instances {
					if in["id"] == w.id {
						return in["log_status"] == "down" || in["log_status"] == "removed"
					}
				}
				return true // forgotten altogether
			})
			w.start(t)
		},
	},
	{
		name:   "disk-limit",
		expect: "a follower edge restarted under RLIMIT_FSIZE at its files' current size (root ignores chmod, so a size limit is the unprivileged disk-full): when raft.db, the archive or a snapshot must grow, the write fails (EFBIG); the edge halts or exits with the failing file named, the other two keep serving; restarted without the limit it catches up",
		long:   true,
		run: func(t *testing.T, v *env, mark func(string)) {
			l := v.waitLeader(20 * time.Second)
			var e *edgeProc
			for _, x := range v.edges {
				if x != l {
					e = x
					break
				}
			}
			_ = e.stop(syscall.SIGTERM, 30*time.Second)
			var limit int64
			for _, f := range []string{"raft.db", "archive.db"} {
				if st, err := os.Stat(filepath.Join(e.dataDir, f)); err == nil {
					limit = max(limit, st.Size())
				}
			}
			limit += 4096
			e.prefix = []string{"prlimit", fmt.Sprintf("--fsize=%d", limit), "--"}
			e.logPath += ".limited"
			mark(e.id)
			e.start(t)
			// New conversations through the other edges make the log
			// grow past the free pages the limited edge's files still
			// have (the steady load is bound conversations: touches only).
			stopGrowth := make(chan struct{})
			grown := make(chan int)
			go func() { grown <- growLog(v, e, stopGrowth) }()
			exited, err := e.exited(20 * time.Second)
			ci, cerr := v.cluster(e)
			close(stopGrowth)
			t.Logf("disk-limit: %d new conversations sent meanwhile", <-grown)
			if !exited && ci.Halted == "" {
				t.Errorf("an edge whose files cannot grow neither exited nor halted")
			}
			if tail := e.tail(40); !strings.Contains(tail, "file too large") && !strings.Contains(tail, ".db") {
				t.Errorf("the edge's log does not name the failing write:\n%s", tail)
			}
			t.Logf("disk-limit: fsize=%d exited=%v (%v) halted=%q cluster_err=%v; log tail:\n%s", limit, exited, err, ci.Halted, cerr, e.tail(8))
			_ = e.stop(syscall.SIGTERM, 30*time.Second)
			e.prefix = nil
			e.logPath = strings.TrimSuffix(e.logPath, ".limited")
			mark(e.id)
			e.start(t)
		},
	},
}

// TestChaos runs every nemesis against one multi-process deployment under
// client load and checks the invariants after each.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process chaos: not in -short")
	}
	v := newEnvWith(t, envOptions{edge: nemesisOverrides})
	for _, nem := range nemeses {
		if nem.long && !longMode() {
			continue
		}
		t.Run(nem.name, func(t *testing.T) {
			v.t = t
			defer func() { v.t = t }()
			restarts := map[string][]time.Time{}
			var rmu sync.Mutex
			mark := func(id string) {
				rmu.Lock()
				restarts[id] = append(restarts[id], time.Now())
				rmu.Unlock()
			}
			ld := startLoad(v, fmt.Sprintf("%s-%d", nem.name, time.Now().UnixNano()%1e6), 30, 12)
			warm := time.NewTimer(1500 * time.Millisecond)
			<-warm.C // let keys bind before the fault (schedule)
			start := time.Now()
			nem.run(t, v, mark)
			v.waitReady(60 * time.Second)
			after := time.NewTimer(1500 * time.Millisecond)
			<-after.C // traffic after the heal (schedule)
			samples := ld.finish()
			hash, index := v.converge(60 * time.Second)
			rmu.Lock()
			vd := v.checkRoutes(samples, restarts)
			rmu.Unlock()
			v.auditVerify(v.waitLeader(20 * time.Second))
			okCount := 0
			for _, s := range samples {
				if s.ok {
					okCount++
				}
			}
			t.Logf("FIGURES chaos nemesis=%s requests=%d sent=%d succeeded=%d retried=%d failed=%d %s lost_bindings=%d served_unbound=%d evicted=%d fault_and_recovery=%s state_index=%d hash=%s… failures=%v",
				nem.name, len(samples), ld.sent.Load(), okCount, ld.retried.Load(), ld.failed.Load(), vd.Verdict, vd.lost, vd.servedUnbound, vd.evicted,
				time.Since(start).Round(time.Millisecond), index, hash[:12], failureReasons(samples))
			if vd.Wrong != 0 {
				t.Errorf("%d wrong answers", vd.Wrong)
			}
			if vd.evicted != 0 && !nem.evicts {
				t.Errorf("%d acknowledged keys were evicted by a fault that should evict nothing (by the entry that removed them: %v)", vd.evicted, vd.evictedBy)
			}
			if nem.noUnhealthy {
				// A NATS outage must not make every worker unhealthy.
				for _, s := range samples {
					if !s.ok && strings.Contains(s.lastErr, "no_healthy_instance") {
						t.Errorf("a request failed with no_healthy_instance during %s although every worker was up (%s)", nem.name, s.lastErr)
						break
					}
				}
			}
		})
	}
}

// growLog sends new conversations to the edges other than skip until stop
// closes, from 8 clients at once (one client over TLS grew the log too
// slowly to reach the end of the limited edge's free pages in time), and
// returns how many were sent.
func growLog(v *env, skip *edgeProc, stop <-chan struct{}) int {
	const clients = 8
	tr := v.transport(clients)
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 2 * time.Second}
	var n atomic.Int64
	var wg sync.WaitGroup
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				for _, e := range v.edges {
					select {
					case <-stop:
						return
					default:
					}
					if e == skip {
						continue
					}
					n.Add(1)
					conv := fmt.Sprintf("disk-growth-%d-%d-%s", w, i, e.id)
					body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 1,
						"messages": []map[string]string{{"role": "user", "content": conv}}})
					req, _ := http.NewRequest("POST", e.url()+"/v1/chat/completions", bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("x-session-id", conv)
					if resp, err := c.Do(req); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
			}
		}()
	}
	wg.Wait()
	return int(n.Load())
}
