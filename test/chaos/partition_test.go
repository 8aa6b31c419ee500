package chaos

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/test/routecheck"
)

// partitionScenario is one network fault between the deployment's
// processes (TestChaosPartitions).
type partitionScenario struct {
	name, expect string
	long         bool // only in long mode
	// cut picks the member to partition and the segments it loses (none:
	// every segment but the client's); edge is the partitioned edge, nil
	// when the member is not an edge.
	cut func(v *env) (member string, segs []string, edge *edgeProc)
	// minority: the partitioned edge is cut from its peers, so it must
	// report itself not ready and refuse what it may not serve with
	// Retry-After.
	minority bool
	// evicts: the fault may evict bindings (a worker the edges cannot
	// reach).
	evicts bool
	// workerCut: a context worker cut from the edges; each edge's failed
	// connects to it and its mark (tether_edge_instance_unreachable) are
	// read before the heal.
	workerCut bool
}

var partitionScenarios = []partitionScenario{
	{
		name:     "leader-minority",
		expect:   "the leader edge cut from everything but its clients: the other two elect a leader and serve; the cut edge reports not ready and refuses with Retry-After what it may not serve; healed, it steps down, catches up and is ready again",
		minority: true,
		cut: func(v *env) (string, []string, *edgeProc) {
			l := v.waitLeader(20 * time.Second)
			return l.id, nil, l
		},
	},
	{
		name:     "follower-minority",
		expect:   "a follower edge cut from everything but its clients: the others serve on; the cut edge reports not ready and refuses with Retry-After what it may not serve; healed, it catches up and is ready again",
		minority: true,
		cut: func(v *env) (string, []string, *edgeProc) {
			l := v.waitLeader(20 * time.Second)
			for _, e := range v.edges {
				if e != l {
					return e.id, nil, e
				}
			}
			return "", nil, nil
		},
	},
	{
		name:   "leader-cut-from-nats",
		expect: "the leader edge cut from NATS but not from its peers or the workers: it keeps the workers' last known health, probes them over HTTP and serves on; it records no worker down for its own silence; healed, it hears telemetry again",
		cut: func(v *env) (string, []string, *edgeProc) {
			l := v.waitLeader(20 * time.Second)
			return l.id, []string{segNATS}, l
		},
	},
	{
		name:      "worker-cut-from-edges",
		evicts:    true,
		workerCut: true,
		expect:    "a context worker cut from the edges but not from NATS (its telemetry still arrives): hops to it fail, each edge marks it unreachable at its first failed connect and from then on sends its keys elsewhere through committed overflows or placements, with no hop waiting out a connect there; healed, a probe clears the mark and it serves again",
		cut: func(v *env) (string, []string, *edgeProc) {
			return v.workers[0].id, []string{segWork}, nil
		},
	},
}

// TestChaosPartitions partitions the deployment's processes from each
// other for real: every process (3 edges, 4 workers, the NATS server) in
// its own network namespace with its own addresses, a member's bridge port
// taken down to cut it (netlab). Under the load of TestChaos (30
// conversations with 2 sub-agents each, 12 clients retrying on the next
// edge), each scenario cuts, holds, heals, and then judges every answer
// by what its edge knew (test/routecheck): 0 wrong, no acknowledged key
// lost. A partitioned minority edge must report itself not ready and
// answer what it does not serve with a refusal carrying Retry-After; its
// readiness after the heal is timed (a figure, not a bound). Root only
// (skipped elsewhere, saying why). Short form (make test): the two minority
// partitions, 3 s each; long form (RELIABILITY_LONG=1): every scenario,
// held 20 s.
func TestChaosPartitions(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process chaos: not in -short")
	}
	lab := newNetlab(t, segPeers, segNATS, segWork)
	v := newNetnsEnv(t, lab, envOptions{})
	hold := 3 * time.Second
	if longMode() {
		hold = 20 * time.Second
	}
	for _, sc := range partitionScenarios {
		if !sc.minority && !longMode() {
			continue
		}
		t.Run(sc.name, func(t *testing.T) {
			v.t = t
			defer func() { v.t = t }()
			runPartition(t, v, lab, sc, hold)
		})
	}
}

// partitionResult is what a scenario measured beyond its judged answers.
type partitionResult struct {
	load           *load
	failed         int64
	cutAt, healAt  time.Time
	unreadyAt      time.Time // the partitioned edge first reported itself not ready (minority)
	probe          *prober   // requests straight to the partitioned edge (nil: not an edge)
	readyAfterHeal time.Duration
	cutWorker      *workerCutFigures // workerCut scenarios
}

// workerCutFigures are, per edge, the hops whose connect failed while the
// worker was cut (tether_edge_upstream_errors_total{kind="connect"}: a
// hop whose client gave up first is not counted), when the edge was first
// seen holding the worker unreachable, and whether it still did just
// before the heal.
type workerCutFigures struct {
	connects    map[string]float64
	unreachable map[string]float64
	markedAfter map[string]time.Duration // first seen marked, after the cut (absent: never)
}

// watchMarks holds the partition until hold has passed since cutAt,
// reading every edge's mark of worker every 100 ms, and returns when each
// edge was first seen holding it unreachable.
func (v *env) watchMarks(worker string, cutAt time.Time, hold time.Duration) map[string]time.Duration {
	out := map[string]time.Duration{}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for time.Since(cutAt) < hold {
		<-tick.C // sampling the marks (schedule)
		for _, e := range v.edges {
			if _, seen := out[e.id]; !seen && v.metric(e, "tether_edge_instance_unreachable", fmt.Sprintf("instance=%q", worker)) == 1 {
				out[e.id] = time.Since(cutAt)
			}
		}
	}
	return out
}

func (w *workerCutFigures) String() string {
	ids := make([]string, 0, len(w.connects))
	for id := range w.connects {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	parts := make([]string, 0, len(ids))
	for _, id := range ids {
		marked := "never"
		if d, ok := w.markedAfter[id]; ok {
			marked = d.Round(100 * time.Millisecond).String()
		}
		parts = append(parts, fmt.Sprintf("%s: hop_connect_errors=%v marked_after=%s unreachable_at_heal=%v", id, w.connects[id], marked, w.unreachable[id]))
	}
	return strings.Join(parts, ", ")
}

// contextConnectFailures is each edge's count of context hops whose
// connect failed.
func (v *env) contextConnectFailures() map[string]float64 {
	out := map[string]float64{}
	for _, e := range v.edges {
		out[e.id] = v.metric(e, "tether_edge_upstream_errors_total", `fleet="context"`, `kind="connect"`)
	}
	return out
}

// workerCutFigures reads, before the heal, what each edge made of the cut
// worker since before (contextConnectFailures at the cut).
func (v *env) workerCutFigures(worker string, before map[string]float64) *workerCutFigures {
	w := &workerCutFigures{connects: map[string]float64{}, unreachable: map[string]float64{}}
	for id, n := range v.contextConnectFailures() {
		w.connects[id] = n - before[id]
	}
	for _, e := range v.edges {
		w.unreachable[e.id] = v.metric(e, "tether_edge_instance_unreachable", fmt.Sprintf("instance=%q", worker))
	}
	return w
}

// runPartition runs one scenario under load, judges it and returns what
// it measured.
func runPartition(t *testing.T, v *env, lab *netlab, sc partitionScenario, hold time.Duration) partitionResult {
	prefix := fmt.Sprintf("%s-%d", sc.name, time.Now().UnixNano()%1e6)
	ld := startLoad(v, prefix, 30, 12)
	warm := time.NewTimer(1500 * time.Millisecond)
	<-warm.C // let keys bind before the fault (schedule)
	member, segs, cutEdge := sc.cut(v)
	var pr *prober
	if cutEdge != nil {
		roots := make([]string, 30)
		for i := range roots {
			roots[i] = fmt.Sprintf("%s-%d", prefix, i)
		}
		pr = startProber(v, cutEdge, roots)
	}
	termBefore := v.term()
	var connectsBefore map[string]float64
	if sc.workerCut {
		connectsBefore = v.contextConnectFailures()
	}
	lab.partition(member, segs...)
	cutAt := time.Now()
	var unreadyAfter time.Duration
	res := partitionResult{load: ld, probe: pr, cutAt: cutAt}
	if sc.minority {
		waitFor(t, 60*time.Second, member+" reporting itself not ready while partitioned", func() bool {
			return !v.ready(cutEdge)
		})
		res.unreadyAt = time.Now()
		unreadyAfter = time.Since(cutAt)
		{
			waitFor(t, 60*time.Second, "a leader among the edges that are not partitioned", func() bool {
				for _, e := range v.edges {
					if e == cutEdge {
						continue
					}
					if ci, err := v.cluster(e); err == nil && ci.IsLeader {
						return true
					}
				}
				return false
			})
		}
	}
	var markedAfter map[string]time.Duration
	if sc.workerCut {
		markedAfter = v.watchMarks(member, cutAt, hold)
	} else {
		h := time.NewTimer(hold)
		<-h.C // the partition (schedule)
	}
	if sc.workerCut {
		res.cutWorker = v.workerCutFigures(member, connectsBefore)
		res.cutWorker.markedAfter = markedAfter
	}
	lab.heal(member)
	healAt := time.Now()
	res.healAt = healAt
	var recovered time.Duration
	if sc.workerCut {
		waitFor(t, 60*time.Second, "every edge holding "+member+" reachable again after the heal", func() bool {
			for _, e := range v.edges {
				if v.metric(e, "tether_edge_instance_unreachable", fmt.Sprintf("instance=%q", member)) != 0 {
					return false
				}
			}
			return true
		})
		recovered = time.Since(healAt)
	}
	if cutEdge != nil {
		waitFor(t, 120*time.Second, member+" ready again after the heal", func() bool { return v.ready(cutEdge) })
		recovered = time.Since(healAt)
	}
	v.waitReady(120 * time.Second)
	if pr != nil {
		pr.finish()
	}
	after := time.NewTimer(1500 * time.Millisecond)
	<-after.C // traffic after the heal (schedule)
	samples := ld.finish()
	var probe probeCounts
	if pr != nil {
		probe = pr.counts(cutAt, healAt)
		samples = append(samples, pr.samples...)
	}
	hash, index := v.converge(120 * time.Second)
	vd := v.checkRoutes(samples, map[string][]time.Time{})
	v.auditVerify(v.waitLeader(20 * time.Second))
	ok := 0
	for _, s := range samples {
		if s.ok {
			ok++
		}
	}
	// ready_after_heal: the cut edge ready again (a minority), or every
	// edge holding the cut worker reachable again (a worker cut).
	t.Logf("FIGURES partition scenario=%s member=%s segments=%v hold=%s requests=%d sent=%d succeeded=%d retried=%d failed=%d %s lost_bindings=%d served_unbound=%d evicted=%d%v term=%d→%d unready_after=%s ready_after_heal=%s state_index=%d hash=%s… failures=%v refusals=%v",
		sc.name, member, segs, hold, len(samples), ld.sent.Load(), ok, ld.retried.Load(), ld.failed.Load(), vd.Verdict, vd.lost, vd.servedUnbound, vd.evicted, vd.evictedBy,
		termBefore, v.term(), unreadyAfter.Round(time.Millisecond), recovered.Round(time.Millisecond), index, hash[:12], failureReasons(samples), ld.refusals)
	if pr != nil {
		t.Logf("FIGURES partition scenario=%s answers of the partitioned edge while cut: %s", sc.name, probe)
	}
	if res.cutWorker != nil {
		t.Logf("FIGURES partition scenario=%s the edges and the cut worker before the heal: %s", sc.name, res.cutWorker)
	}
	if vd.Wrong != 0 {
		t.Errorf("%d wrong answers", vd.Wrong)
	}
	if vd.evicted != 0 && !sc.evicts {
		t.Errorf("%d acknowledged keys were evicted by a fault that should evict nothing (by the entry that removed them: %v)", vd.evicted, vd.evictedBy)
	}
	for _, bad := range probe.withoutRetryAfter {
		t.Errorf("the partitioned edge refused without Retry-After: %s", bad)
	}
	res.failed, res.readyAfterHeal = ld.failed.Load(), recovered
	return res
}

// ready reports whether e answers /readyz 200.
func (v *env) ready(e *edgeProc) bool {
	c := &http.Client{Transport: v.client.Transport, Timeout: 2 * time.Second}
	resp, err := c.Get(e.url() + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// probeTimeout is how long the prober waits for the partitioned edge's
// answer: far more than a refusal takes.
const probeTimeout = 5 * time.Second

// prober sends requests straight to one edge (no retry elsewhere): turns
// of the load's conversations (keys bound before the fault) and new
// conversations, and records every answer; its 200s are judged with the
// load's.
type prober struct {
	v       *env
	e       *edgeProc
	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	answers []probeAnswer
	samples []sample
}

// probeAnswer is one answer of the probed edge.
type probeAnswer struct {
	at         time.Time
	took       time.Duration
	status     int // 0: no HTTP answer
	code       string
	retryAfter bool
	err        string
}

func startProber(v *env, e *edgeProc, roots []string) *prober {
	p := &prober{v: v, e: e, stop: make(chan struct{})}
	client := &http.Client{Transport: v.transport(8), Timeout: probeTimeout}
	for w := range 6 {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			rng := rand.New(rand.NewSource(time.Now().UnixNano() + int64(w)))
			for n := 0; ; n++ {
				select {
				case <-p.stop:
					return
				default:
				}
				key := roots[rng.Intn(len(roots))]
				if n%2 == 1 {
					key = fmt.Sprintf("probe-%s-%d-%d", e.id, w, n)
				}
				p.once(client, key, n)
				pace := time.NewTimer(50 * time.Millisecond)
				<-pace.C // request pacing (schedule)
			}
		}()
	}
	return p
}

func (p *prober) once(client *http.Client, key string, n int) {
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 2,
		"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("%s probe %d", key, n)}}})
	req, _ := http.NewRequest("POST", p.e.url()+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-session-id", key)
	s := sample{root: key, conv: key, start: time.Now()}
	a := probeAnswer{at: s.start}
	resp, err := client.Do(req)
	if err != nil {
		a.err = errClass(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		a.status = resp.StatusCode
		a.retryAfter = resp.Header.Get("Retry-After") != ""
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		a.code = e.Error.Code
		if resp.StatusCode == http.StatusOK {
			s.ok, s.edge = true, p.e.id
			s.route = routecheck.ParseRoute(resp.Header.Get("x-tether-route"))
			s.prompt = promptTokens(b)
		}
	}
	s.end = time.Now()
	a.took = s.end.Sub(s.start)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answers = append(p.answers, a)
	if s.ok {
		p.samples = append(p.samples, s)
	}
}

func (p *prober) finish() {
	close(p.stop)
	p.wg.Wait()
}

// probeCounts are the probed edge's answers to requests sent while it was
// cut (from the cut to the heal).
type probeCounts struct {
	cut               int            // requests sent while cut
	byOutcome         map[string]int // "200", "503 state_stalled", "transport: …"
	withoutRetryAfter []string       // refusals (429, 503) without Retry-After
	hung              int            // no answer within probeTimeout
	took              []time.Duration
	first             []string // the first answers: outcome and time taken
}

func (p *prober) counts(from, to time.Time) probeCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := probeCounts{byOutcome: map[string]int{}}
	for _, a := range p.answers {
		if a.at.Before(from) || !a.at.Before(to) {
			continue
		}
		c.cut++
		c.took = append(c.took, a.took)
		if len(c.first) < 12 {
			c.first = append(c.first, fmt.Sprintf("+%s %d %s%s took %s", a.at.Sub(from).Round(time.Millisecond), a.status, a.code, a.err, a.took.Round(time.Millisecond)))
		}
		switch {
		case a.status == 0:
			c.byOutcome["transport: "+a.err]++
			if strings.Contains(a.err, "Client.Timeout") {
				c.hung++
			}
		default:
			c.byOutcome[strings.TrimSpace(fmt.Sprintf("%d %s", a.status, a.code))]++
			if (a.status == http.StatusServiceUnavailable || a.status == http.StatusTooManyRequests) && !a.retryAfter {
				c.withoutRetryAfter = append(c.withoutRetryAfter, fmt.Sprintf("%d %s at %s", a.status, a.code, a.at.Format(time.RFC3339Nano)))
			}
		}
	}
	return c
}

func (c probeCounts) String() string {
	keys := make([]string, 0, len(c.byOutcome))
	for k := range c.byOutcome {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%q=%d", k, c.byOutcome[k]))
	}
	sort.Slice(c.took, func(i, j int) bool { return c.took[i] < c.took[j] })
	lat := "-"
	if n := len(c.took); n > 0 {
		lat = fmt.Sprintf("p50=%s max=%s", c.took[n/2].Round(time.Millisecond), c.took[n-1].Round(time.Millisecond))
	}
	return fmt.Sprintf("sent_while_cut=%d {%s} refusals_without_retry_after=%d no_answer_within_%s=%d answer_time %s first=%q",
		c.cut, strings.Join(parts, " "), len(c.withoutRetryAfter), probeTimeout, c.hung, lat, c.first)
}
