package devstack

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// Shape of BenchmarkNewVsStickyClosedLoop (figures in BENCHMARKS.md, "New
// conversations against sticky ones, 16 clients").
const (
	closedLoopClients   = 16
	closedLoopPerClient = 400 // requests per client per iteration, half new, half sticky
)

// BenchmarkNewVsStickyClosedLoop: the latency a new conversation adds over a
// sticky one through a 3-edge deployment at the shipped defaults
// (plaintext, instant simulated engine), closed loop: 16 HTTP clients, each
// alternating a new conversation and a turn on a bound one, every request on
// the next edge in turn. Both kinds share the same run, so the machine's
// load weighs on both alike. Metrics: p50/p99 ms of each kind and added
// (new − sticky) at p50 and p99.
func BenchmarkNewVsStickyClosedLoop(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	st, err := Start(ctx, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close(context.Background())
	if err := st.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	tr := &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 512, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	nb := &newVsBound{ctx: ctx, st: st, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}, body: newVsBoundBody(st.Model())}
	if err := nb.closedLoop(newVsBoundWarmup, closedLoopClients, func(i int) (string, int) { return fmt.Sprintf("warm-%d", i), i }); err != nil {
		b.Fatal("warm-up: ", err)
	}
	pool := make([]string, closedLoopClients*closedLoopPerClient/2)
	for i := range pool {
		pool[i] = fmt.Sprintf("sticky-%d", i)
	}
	if err := nb.closedLoop(len(pool), closedLoopClients, func(i int) (string, int) { return pool[i], i }); err != nil {
		b.Fatal("binding the pool: ", err)
	}
	if err := nb.waitApplied(ctx); err != nil {
		b.Fatal(err)
	}
	var newLat, stickyLat []float64
	failed := 0
	run := 0
	for b.Loop() {
		n, s, f := nb.alternate(run, pool)
		newLat, stickyLat, failed = append(newLat, n...), append(stickyLat, s...), failed+f
		run++
	}
	slices.Sort(newLat)
	slices.Sort(stickyLat)
	b.ReportMetric(quantile(newLat, 0.50), "new-ms-p50")
	b.ReportMetric(quantile(newLat, 0.99), "new-ms-p99")
	b.ReportMetric(quantile(stickyLat, 0.50), "sticky-ms-p50")
	b.ReportMetric(quantile(stickyLat, 0.99), "sticky-ms-p99")
	b.ReportMetric(quantile(newLat, 0.50)-quantile(stickyLat, 0.50), "added-ms-p50")
	b.ReportMetric(quantile(newLat, 0.99)-quantile(stickyLat, 0.99), "added-ms-p99")
	b.ReportMetric(float64(failed), "failed")
}

// alternate runs one iteration: every client alternates a new conversation
// and a sticky turn, each on the next edge.
func (nb *newVsBound) alternate(run int, pool []string) (newMs, stickyMs []float64, failed int) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for c := range closedLoopClients {
		wg.Go(func() {
			var n, s []float64
			f := 0
			for k := range closedLoopPerClient {
				edge := c + k
				session := pool[(c*closedLoopPerClient/2+k/2)%len(pool)]
				if k%2 == 0 {
					session = fmt.Sprintf("new-%d-%d-%d", run, c, k)
				}
				d, err := nb.send(edge, session)
				switch {
				case err != nil:
					f++
				case k%2 == 0:
					n = append(n, float64(d)/float64(time.Millisecond))
				default:
					s = append(s, float64(d)/float64(time.Millisecond))
				}
			}
			mu.Lock()
			newMs, stickyMs, failed = append(newMs, n...), append(stickyMs, s...), failed+f
			mu.Unlock()
		})
	}
	wg.Wait()
	return newMs, stickyMs, failed
}
