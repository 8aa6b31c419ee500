package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/tether-project/tether/edge"
)

// Pacing of BenchmarkNewVsBoundConversation (its figures are in
// BENCHMARKS.md, "The log off the request path").
const (
	defaultNewPerSecond = 1000            // offered rate of new conversations (and of bound turns)
	newVsBoundPhase     = 3 * time.Second // paced traffic per benchmark iteration
	boundPoolSize       = 1000            // conversations bound before the run
	newVsBoundWarmup    = 300             // requests before the pool (connections, code paths)
)

// newPerSecond is the offered rate of new conversations, and the same rate
// of turns on bound ones: defaultNewPerSecond, or BENCH_NEW_PER_SECOND to
// find where the figures stop depending on the load.
func newPerSecond() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_NEW_PER_SECOND")); err == nil && n > 0 && n <= 20000 {
		return n
	}
	return defaultNewPerSecond
}

// BenchmarkNewVsBoundConversation: the latency a new conversation adds over
// a bound one, end to end through a 3-edge deployment with the shipped
// defaults (plaintext, instant simulated engine, fsync on). A pool of
// conversations is bound first; then, in one open-loop run, 1,000 new
// conversations/s (each placed at once, its Bind proposed beside the
// dispatch; with placement.commit_first it commits through the affinity log
// before the request is routed, two of three forwarded by a follower to the
// leader) are interleaved with 1,000 turns/s on the bound conversations (a
// local lookup), both spread over all three edges.
// Metrics: p50/p99 ms of each kind, and the added latency (new minus bound)
// at p50 and p99; achieved rates and new_bind decisions per new
// conversation show that the traffic was what it claims.
func BenchmarkNewVsBoundConversation(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var o Options
	if os.Getenv("BENCH_COMMIT_FIRST") == "1" {
		// The edges' placement.commit_first: a new conversation waits for
		// its Bind (the behaviour before placement left the request path).
		o.EdgeConfig = func(_ int, c *edge.Config) { c.Placement.CommitFirst = true }
	}
	if os.Getenv("BENCH_LOG") != "" { // the stack's warnings on stderr, to tell why a run failed
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	st, err := Start(ctx, o)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close(context.Background())
	if err := st.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	tr := &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 512, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	nb := &newVsBound{
		ctx: ctx, st: st,
		client: &http.Client{Transport: tr, Timeout: 30 * time.Second},
		body:   newVsBoundBody(st.Model()),
	}
	// Warm up (connections, code paths), then bind the pool and wait until
	// every edge applied it, so a bound turn is a lookup wherever it lands.
	if err := nb.closedLoop(newVsBoundWarmup, 16, func(i int) (string, int) { return fmt.Sprintf("warm-%d", i), i }); err != nil {
		b.Fatal("warm-up: ", err)
	}
	pool := make([]string, boundPoolSize)
	for i := range pool {
		pool[i] = fmt.Sprintf("bound-%d", i)
	}
	if err := nb.closedLoop(len(pool), 16, func(i int) (string, int) { return pool[i], i }); err != nil {
		b.Fatal("binding the pool: ", err)
	}
	if err := nb.waitApplied(ctx); err != nil {
		b.Fatal(err)
	}
	// One more turn on each pooled conversation on another edge: the
	// paced run then measures steady-state bound turns.
	if err := nb.closedLoop(len(pool), 16, func(i int) (string, int) { return pool[i], i + 1 }); err != nil {
		b.Fatal("touching the pool: ", err)
	}
	before := nb.counters()
	var newLat, newFollower, newLeader, boundLat []float64
	var elapsed time.Duration
	var newN, newFailed, boundFailed int
	run := 0
	for b.Loop() {
		nfl, nl, bl, ne, be, d, err := nb.paced(run, pool)
		if err != nil {
			b.Logf("run %d: %d new and %d bound requests failed, the first of each: %v", run, ne, be, err)
		}
		newFailed += ne
		boundFailed += be
		newLat = append(newLat, nfl...)
		newLat = append(newLat, nl...)
		newFollower = append(newFollower, nfl...)
		newLeader = append(newLeader, nl...)
		boundLat = append(boundLat, bl...)
		newN += len(nl) + len(nfl)
		elapsed += d
		run++
	}
	after := nb.counters()
	slices.Sort(newLat)
	slices.Sort(newFollower)
	slices.Sort(newLeader)
	slices.Sort(boundLat)
	newP50, newP99 := quantile(newLat, 0.50), quantile(newLat, 0.99)
	boundP50, boundP99 := quantile(boundLat, 0.50), quantile(boundLat, 0.99)
	b.ReportMetric(newP50, "new-ms-p50")
	b.ReportMetric(newP99, "new-ms-p99")
	b.ReportMetric(quantile(newLeader, 0.50), "new-on-leader-ms-p50")
	b.ReportMetric(quantile(newLeader, 0.99), "new-on-leader-ms-p99")
	b.ReportMetric(quantile(newFollower, 0.50), "new-on-follower-ms-p50")
	b.ReportMetric(quantile(newFollower, 0.99), "new-on-follower-ms-p99")
	b.ReportMetric(boundP50, "bound-ms-p50")
	b.ReportMetric(boundP99, "bound-ms-p99")
	b.ReportMetric(newP50-boundP50, "added-ms-p50")
	b.ReportMetric(newP99-boundP99, "added-ms-p99")
	b.ReportMetric(float64(len(newLat))/elapsed.Seconds(), "new-ok/s")
	b.ReportMetric(float64(len(boundLat))/elapsed.Seconds(), "bound-ok/s")
	b.ReportMetric(float64(newFailed), "new-failed")
	b.ReportMetric(float64(boundFailed), "bound-failed")
	if newN > 0 {
		b.ReportMetric((after["outcome:new_bind"]-before["outcome:new_bind"])/float64(newN), "new_binds/new-conv")
	}
	var other float64
	for _, o := range []string{"degraded", "shed", "unbound", "refused"} {
		other += after["outcome:"+o] - before["outcome:"+o]
	}
	b.ReportMetric(other, "degraded+shed+unbound+refused")
	// Where a Bind's time went (means over the run, every edge).
	for _, stage := range []string{"queue", "commit", "forward", "follower_apply"} {
		b.ReportMetric(1000*meanDelta(before, after, "stage:"+stage), "stage-"+stage+"-ms-mean")
	}
	b.ReportMetric(meanDelta(before, after, "batch"), "entries/batch")
}

type newVsBound struct {
	ctx    context.Context
	st     *Stack
	client *http.Client
	body   []byte
}

// newVsBoundBody is a small chat request generating one token.
func newVsBoundBody(model string) []byte {
	body, _ := json.Marshal(map[string]any{
		"model": model, "max_tokens": 1,
		"messages": []map[string]string{{"role": "user", "content": "hello"}},
	})
	return body
}

// send posts one turn of conversation session to edge i (mod the edges)
// and returns its latency, from just before the request is written to the
// end of the response body.
func (nb *newVsBound) send(edge int, session string) (time.Duration, error) {
	edges := nb.st.Edges()
	req, err := http.NewRequestWithContext(nb.ctx, http.MethodPost, edges[edge%len(edges)].URL()+"/v1/chat/completions", bytes.NewReader(nb.body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-session-id", session)
	t0 := time.Now()
	resp, err := nb.client.Do(req)
	if err != nil {
		return 0, err
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	d := time.Since(t0)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("session %s on edge %d: HTTP %d: %s", session, edge%len(edges), resp.StatusCode, bytes.TrimSpace(msg))
	}
	return d, nil
}

// closedLoop sends n requests with the given concurrency, retrying a
// failed one on the next edge; at(i) names the conversation and the edge
// of request i.
func (nb *newVsBound) closedLoop(n, workers int, at func(i int) (string, int)) error {
	var next atomic.Int64
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				session, edge := at(i)
				var err error
				for try := range 5 { // a client retries a 503 (Retry-After); setup is not measured
					if _, err = nb.send(edge+try, session); err == nil {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// waitApplied waits until every edge's replicated state holds as many
// bindings as the leader's.
func (nb *newVsBound) waitApplied(ctx context.Context) error {
	for {
		var lens []int
		for _, n := range nb.st.Edges() {
			lens = append(lens, n.Edge().Node().State().Len())
		}
		if slices.Min(lens) == slices.Max(lens) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("edges did not converge on the bindings (%v): %w", lens, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// paced runs one open-loop phase: every 1/(new+bound rate) a request is
// launched on its own goroutine, alternately a new conversation and a turn
// on a pooled one, whatever the responses' latency (a slow response does
// not slow the offered rate). Request k of a kind goes to edge k mod 3,
// the bound kind shifted by one so the two kinds do not pair up on an
// edge. It returns the latencies in ms of the successful requests (new
// conversations sent to a follower edge, to the leader edge, bound turns), the failures of each kind and the first of each, and the phase's
// duration.
func (nb *newVsBound) paced(run int, pool []string) (newMs, newLeaderMs, boundMs []float64, newErrs, boundErrs int, d time.Duration, err error) {
	var firstNewErr, firstBoundErr error
	leader := -1 // the leader when the phase starts (an election during it blurs the split)
	if l := nb.st.Leader(); l != nil {
		leader = l.Index
	}
	edges := len(nb.st.Edges())
	rate := 2 * newPerSecond() // new conversations and bound turns
	total := int(newVsBoundPhase.Seconds() * float64(rate))
	interval := time.Second / time.Duration(rate)
	var mu sync.Mutex
	var wg sync.WaitGroup
	record := func(isNew, onLeader bool, lat time.Duration, e error) {
		mu.Lock()
		defer mu.Unlock()
		if e != nil {
			// Counted, not fatal: an overloaded edge answers 503 (a Bind
			// that missed propose_timeout on a follower that cannot place
			// it degraded), which is the figure's to report.
			if isNew {
				newErrs++
			} else {
				boundErrs++
			}
			if isNew && firstNewErr == nil {
				firstNewErr = e
			} else if !isNew && firstBoundErr == nil {
				firstBoundErr = e
			}
			return
		}
		ms := float64(lat.Microseconds()) / 1000
		switch {
		case isNew && onLeader:
			newLeaderMs = append(newLeaderMs, ms)
		case isNew:
			newMs = append(newMs, ms)
		default:
			boundMs = append(boundMs, ms)
		}
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	launched := 0
	for launched < total {
		due := min(total, int(time.Since(start)/interval)+1)
		for ; launched < due; launched++ {
			k := launched / 2
			if launched%2 == 0 {
				session, edge := fmt.Sprintf("new-%d-%d", run, k), k
				wg.Go(func() { lat, e := nb.send(edge, session); record(true, edge%edges == leader, lat, e) })
			} else {
				session, edge := pool[k%len(pool)], k+1
				wg.Go(func() { lat, e := nb.send(edge, session); record(false, false, lat, e) })
			}
		}
		<-tick.C
	}
	wg.Wait()
	return newMs, newLeaderMs, boundMs, newErrs, boundErrs, time.Since(start), errors.Join(firstNewErr, firstBoundErr)
}

// counters sums, over every edge, the routing decisions by outcome
// ("outcome:new_bind"), and the sum and count of each proposal stage
// ("stage:commit:sum", "stage:commit:count") and of the batch sizes
// ("batch:sum", "batch:count").
func (nb *newVsBound) counters() map[string]float64 {
	out := map[string]float64{}
	for _, n := range nb.st.Edges() {
		mfs, err := n.Edge().Registry().Gather()
		if err != nil {
			continue
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				switch mf.GetName() {
				case "tether_edge_routing_decisions_total":
					out["outcome:"+label(m, "outcome")] += m.GetCounter().GetValue()
				case "tether_cluster_propose_stage_seconds":
					out["stage:"+label(m, "stage")+":sum"] += m.GetHistogram().GetSampleSum()
					out["stage:"+label(m, "stage")+":count"] += float64(m.GetHistogram().GetSampleCount())
				case "tether_cluster_batch_size":
					out["batch:sum"] += m.GetHistogram().GetSampleSum()
					out["batch:count"] += float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// meanDelta is the mean of a sum/count pair between two counters().
func meanDelta(before, after map[string]float64, key string) float64 {
	n := after[key+":count"] - before[key+":count"]
	if n == 0 {
		return 0
	}
	return (after[key+":sum"] - before[key+":sum"]) / n
}

// quantile of sorted xs (nearest rank); 0 when empty.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}
