package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestChaosStarvation: many clients with long prompts at the same CPU
// priority as the deployment, on this 2-core machine (3 edges, 4 workers
// and the load generator compete for it). Raft must keep its leader: no
// election, and at least 99 % of the answers 200 or 429 (an edge sheds
// with Retry-After while its own work saturates it). Before the edges
// shed at all, 400 such clients made the leader step down three times
// ("failed to contact quorum of nodes") and ~9 % of the requests were 503.
//
// Long (make soak): CHAOS_STARVE_CLIENTS (400) clients with
// CHAOS_STARVE_WORDS (2,000)-word prompts for CHAOS_STARVE_SECONDS (60), and
// the targets asserted. Short (make test): 60 clients, 500 words, 8 s; the
// figures are logged and only what holds on any machine is asserted: every
// 429 and 503 carries Retry-After, and no request is answered by a wrong
// instance.
func TestChaosStarvation(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: not in -short")
	}
	clients, words, seconds := 60, 500, 8
	if longMode() {
		clients, words, seconds = 400, 2000, 60
	}
	for _, e := range []struct {
		name string
		v    *int
	}{{"CHAOS_STARVE_CLIENTS", &clients}, {"CHAOS_STARVE_WORDS", &words}, {"CHAOS_STARVE_SECONDS", &seconds}} {
		if n, err := strconv.Atoi(os.Getenv(e.name)); err == nil && n > 0 {
			*e.v = n
		}
	}
	// CHAOS_STARVE_RAFT=heartbeat,election,lease (e.g. 1s,1s,1s) measures
	// other Raft timings than the shipped ones (the figures then say so).
	var o envOptions
	if rt := os.Getenv("CHAOS_STARVE_RAFT"); rt != "" {
		p := strings.Split(rt, ",")
		if len(p) != 3 {
			t.Fatalf("CHAOS_STARVE_RAFT=%q: want heartbeat,election,lease", rt)
		}
		o.edge = map[string]any{"cluster.raft.heartbeat_timeout": p[0], "cluster.raft.election_timeout": p[1], "cluster.raft.leader_lease_timeout": p[2]}
	}
	// CHAOS_STARVE_MAX_SCHED (e.g. 50ms, or -1ms: no shedding) measures
	// another admission.max_scheduling_latency than the shipped one.
	if a := os.Getenv("CHAOS_STARVE_MAX_SCHED"); a != "" {
		if o.edge == nil {
			o.edge = map[string]any{}
		}
		o.edge["admission.max_scheduling_latency"] = a
	}
	// CHAOS_STARVE_MIN_CPU_SHARE (e.g. 0.25, or -1: the scheduling latency
	// alone sheds) measures another admission.min_cpu_share.
	if a := os.Getenv("CHAOS_STARVE_MIN_CPU_SHARE"); a != "" {
		f, err := strconv.ParseFloat(a, 64)
		if err != nil {
			t.Fatalf("CHAOS_STARVE_MIN_CPU_SHARE=%q: %v", a, err)
		}
		if o.edge == nil {
			o.edge = map[string]any{}
		}
		o.edge["admission.min_cpu_share"] = f
	}
	v := newEnvWith(t, o)
	before := v.raftEvents()
	terms0 := v.terms()
	cpu0 := v.cpuSeconds()
	hb0 := v.scrapeHistogram("tether_cluster_raft_heartbeat_seconds")
	age0 := v.scrapeHistogram("tether_cluster_raft_leader_contact_age_seconds")

	st := &starveStats{codes: map[string]int{}}
	tr := v.transport(clients)
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(i) + start.UnixNano()))
			for s := 0; ; s++ {
				conv := fmt.Sprintf("starve-%d-%d-%d", start.UnixNano()%1e6, i, s)
				prefix := words2(rng, words)
				for turn := range 3 {
					if !st.turn(c, v, rng, conv, prefix, turn, stop) {
						return
					}
				}
			}
		}()
	}
	// A timeline of each edge's admission state, every 2 s (figures).
	timeline := v.admissionTimeline(seconds, start)
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)
	cpu := v.cpuSeconds().sub(cpu0)
	terms1 := v.terms()
	after := v.raftEvents()
	hb := v.scrapeHistogram("tether_cluster_raft_heartbeat_seconds").sub(hb0)
	age := v.scrapeHistogram("tether_cluster_raft_leader_contact_age_seconds").sub(age0)
	elections := 0
	for id, t1 := range terms1 {
		elections = max(elections, int(t1-terms0[id]))
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	total := st.attempts
	good := st.codes["200"] + st.codes["429"]
	sort.Slice(st.okLatency, func(i, j int) bool { return st.okLatency[i] < st.okLatency[j] })
	pct := func(p float64) time.Duration {
		if len(st.okLatency) == 0 {
			return 0
		}
		return st.okLatency[min(len(st.okLatency)-1, int(p*float64(len(st.okLatency))))]
	}
	share := 0.0
	if total > 0 {
		share = 100 * float64(good) / float64(total)
	}
	t.Logf("FIGURES starvation raft=%q max_sched=%q min_cpu_share=%q clients=%d words=%d seconds=%.0f attempts=%d turns_done=%d answered_200_or_429=%.2f%% statuses=%v p50_200=%s p99_200=%s missing_retry_after=%d term_changes=%d raft=%s heartbeat_rtt=[%s] leader_contact_age=[%s] cpu_seconds=[%s]",
		os.Getenv("CHAOS_STARVE_RAFT"), os.Getenv("CHAOS_STARVE_MAX_SCHED"), os.Getenv("CHAOS_STARVE_MIN_CPU_SHARE"), clients, words, elapsed.Seconds(), total, st.codes["200"], share, st.codes, pct(0.5).Round(time.Millisecond), pct(0.99).Round(time.Millisecond),
		st.noRetryAfter, elections, after.sub(before), hb, age, cpu)
	t.Logf("admission timeline:\n%s", strings.Join(timeline, "\n"))
	for k, msg := range st.firstErr {
		t.Logf("first %s: %s", k, msg)
	}
	if st.noRetryAfter != 0 {
		t.Errorf("%d answers 429 or 503 without Retry-After", st.noRetryAfter)
	}
	if longMode() {
		if elections != 0 || after.sub(before).stepDowns != 0 {
			t.Errorf("%d term changes, %d leader step-downs under load (want none)", elections, after.sub(before).stepDowns)
		}
		if share < 99 {
			t.Errorf("%.2f %% of the answers were 200 or 429, want ≥ 99 %%", share)
		}
	}
}

type starveStats struct {
	mu           sync.Mutex
	attempts     int
	codes        map[string]int // status (and error code for non-200s)
	noRetryAfter int
	okLatency    []time.Duration
	firstErr     map[string]string // transport error class → its first message
}

// turn sends one turn of conv until it is answered 200 (waiting what a
// 429 or 503 asks, as the OpenAI SDKs do) or the run stops; false once
// stopped.
func (s *starveStats) turn(c *http.Client, v *env, rng *rand.Rand, conv, prefix string, turn int, stop <-chan struct{}) bool {
	msgs := []map[string]string{{"role": "system", "content": prefix}}
	for i := 0; i <= turn; i++ {
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("%s turn %d", conv, i)})
		if i < turn {
			msgs = append(msgs, map[string]string{"role": "assistant", "content": "ok"})
		}
	}
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 4, "messages": msgs})
	for attempt := 0; attempt < 8; attempt++ {
		select {
		case <-stop:
			return false
		default:
		}
		e := v.edges[rng.Intn(len(v.edges))]
		req, _ := http.NewRequest("POST", e.url()+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-session-id", conv)
		t0 := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			s.recordTransport(err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		lat := time.Since(t0)
		if resp.StatusCode == 200 {
			s.record("200", lat, false)
			return true
		}
		var ae struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(b, &ae)
		key := strconv.Itoa(resp.StatusCode)
		if resp.StatusCode != 429 {
			key += " " + ae.Error.Code
		}
		wait := time.Duration(0)
		if ms, err := strconv.Atoi(resp.Header.Get("Retry-After-Ms")); err == nil {
			wait = time.Duration(ms) * time.Millisecond
		} else if sec, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			wait = time.Duration(sec) * time.Second
		}
		missing := (resp.StatusCode == 429 || resp.StatusCode == 503) && resp.Header.Get("Retry-After") == ""
		s.record(key, 0, missing)
		if wait <= 0 {
			wait = 200 * time.Millisecond
		}
		select { // the client's back-off, as asked
		case <-stop:
			return false
		case <-time.After(min(wait, 5*time.Second)):
		}
	}
	return true
}

// recordTransport counts a transport error by class and keeps the first
// full message of each class (logged with the figures).
func (s *starveStats) recordTransport(err error) {
	key := "transport:" + errClass(err)
	s.mu.Lock()
	if s.firstErr == nil {
		s.firstErr = map[string]string{}
	}
	if _, ok := s.firstErr[key]; !ok {
		s.firstErr[key] = err.Error()
	}
	s.mu.Unlock()
	s.record(key, 0, false)
}

func (s *starveStats) record(key string, lat time.Duration, noRetryAfter bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts++
	s.codes[key]++
	if lat > 0 {
		s.okLatency = append(s.okLatency, lat)
	}
	if noRetryAfter {
		s.noRetryAfter++
	}
}

// words2 is n words of text, different for each call.
func words2(rng *rand.Rand, n int) string {
	vocab := []string{"agent", "tool", "call", "result", "plan", "step", "file", "edit", "test", "build", "error", "trace", "value", "index",
		"return", "branch", "commit", "review", "patch", "function", "module", "package", "request", "response", "stream", "token"}
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocab[rng.Intn(len(vocab))])
		if rng.Intn(8) == 0 {
			b.WriteString(strconv.Itoa(rng.Intn(1000)))
		}
	}
	return b.String()
}

// terms is each running edge's Raft term.
func (v *env) terms() map[string]uint64 {
	out := map[string]uint64{}
	for _, e := range v.edges {
		if ci, err := v.cluster(e); err == nil {
			out[e.id] = ci.Term
		}
	}
	return out
}

// raftCounts are Raft's own reports in the edges' logs.
type raftCounts struct {
	stepDowns  int // "failed to contact quorum of nodes, stepping down"
	candidates int // "entering candidate state"
	noContact  int // the leader's "failed to contact" a follower beyond the lease
	maxGap     time.Duration
}

func (r raftCounts) sub(o raftCounts) raftCounts {
	return raftCounts{stepDowns: r.stepDowns - o.stepDowns, candidates: r.candidates - o.candidates, noContact: r.noContact - o.noContact, maxGap: r.maxGap}
}

func (r raftCounts) String() string {
	return fmt.Sprintf("step_downs=%d candidates=%d lease_misses=%d max_miss=%s", r.stepDowns, r.candidates, r.noContact, r.maxGap.Round(time.Millisecond))
}

// raftEvents counts Raft's step-downs, elections and lease misses in every
// edge's log so far.
func (v *env) raftEvents() raftCounts {
	var out raftCounts
	for _, e := range v.edges {
		b, err := os.ReadFile(e.logPath)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			switch {
			case strings.Contains(line, "failed to contact quorum of nodes"):
				out.stepDowns++
			case strings.Contains(line, "entering candidate state"):
				out.candidates++
			case strings.Contains(line, "failed to contact"):
				out.noContact++
				if _, rest, ok := strings.Cut(line, " time="); ok {
					f := strings.Fields(rest)
					if len(f) > 0 {
						if d, err := time.ParseDuration(strings.Trim(f[0], `"`)); err == nil {
							out.maxGap = max(out.maxGap, d)
						}
					}
				}
			}
		}
	}
	return out
}

// histogram is a Prometheus histogram summed over the edges: cumulative
// counts by upper bound.
type histogram struct {
	bounds []float64
	counts []float64
}

// scrapeHistogram reads metric's buckets from every edge and sums them.
func (v *env) scrapeHistogram(metric string) histogram {
	sums := map[float64]float64{}
	for _, e := range v.edges {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", e.url()+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := v.client.Do(req)
		if err != nil {
			cancel()
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(line, metric+"_bucket{") {
				continue
			}
			_, rest, _ := strings.Cut(line, `le="`)
			le, val, _ := strings.Cut(rest, `"} `)
			bound := math.Inf(1)
			if le != "+Inf" {
				bound, _ = strconv.ParseFloat(le, 64)
			}
			n, _ := strconv.ParseFloat(strings.TrimSpace(val), 64)
			sums[bound] += n
		}
	}
	var h histogram
	for b := range sums {
		h.bounds = append(h.bounds, b)
	}
	sort.Float64s(h.bounds)
	for _, b := range h.bounds {
		h.counts = append(h.counts, sums[b])
	}
	return h
}

// sub is h minus an earlier scrape o.
func (h histogram) sub(o histogram) histogram {
	out := histogram{bounds: h.bounds, counts: append([]float64(nil), h.counts...)}
	for i, b := range h.bounds {
		for j, ob := range o.bounds {
			if ob == b {
				out.counts[i] -= o.counts[j]
			}
		}
	}
	return out
}

// quantile is the upper bound of the bucket holding quantile q.
func (h histogram) quantile(q float64) float64 {
	if len(h.counts) == 0 || h.counts[len(h.counts)-1] == 0 {
		return 0
	}
	total := h.counts[len(h.counts)-1]
	for i, c := range h.counts {
		if c >= q*total {
			return h.bounds[i]
		}
	}
	return math.Inf(1)
}

func (h histogram) String() string {
	if len(h.counts) == 0 {
		return "none"
	}
	ms := func(s float64) string {
		if math.IsInf(s, 1) {
			return ">max"
		}
		return strconv.FormatFloat(s*1000, 'f', -1, 64) + "ms"
	}
	return fmt.Sprintf("n=%.0f p50≤%s p99≤%s p99.9≤%s max≤%s", h.counts[len(h.counts)-1], ms(h.quantile(.5)), ms(h.quantile(.99)), ms(h.quantile(.999)), ms(h.quantile(1)))
}

// cpuUse is CPU seconds (user+system) by process kind.
type cpuUse map[string]float64

func (c cpuUse) sub(o cpuUse) cpuUse {
	out := cpuUse{}
	for k, v := range c {
		out[k] = v - o[k]
	}
	return out
}

func (c cpuUse) String() string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%.1f", k, c[k]))
	}
	return strings.Join(parts, " ")
}

// cpuSeconds reads the CPU time of the edges, the workers and this test
// process (the load generator) from /proc (empty where there is none).
func (v *env) cpuSeconds() cpuUse {
	out := cpuUse{}
	read := func(pid int) float64 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0
		}
		// Fields after the parenthesised command: utime is the 12th, stime the 13th.
		_, rest, ok := strings.Cut(string(b), ") ")
		if !ok {
			return 0
		}
		f := strings.Fields(rest)
		if len(f) < 13 {
			return 0
		}
		u, _ := strconv.ParseFloat(f[11], 64)
		s, _ := strconv.ParseFloat(f[12], 64)
		return (u + s) / 100 // USER_HZ
	}
	for _, e := range v.edges {
		e.mu.Lock()
		if e.cmd != nil && e.cmd.Process != nil {
			out["edges"] += read(e.cmd.Process.Pid)
		}
		e.mu.Unlock()
	}
	for _, w := range v.workers {
		w.mu.Lock()
		if w.cmd != nil && w.cmd.Process != nil {
			out["workers"] += read(w.cmd.Process.Pid)
		}
		w.mu.Unlock()
	}
	out["test_process(load,nats)"] = read(os.Getpid())
	return out
}
