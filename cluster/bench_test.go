package cluster

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkBindCommit measures new-key Binds committed by a 3-node cluster
// on loopback TCP with fsync on (raft-boltdb and the archive), proposers
// spread over all nodes (two thirds of them forward to the leader).
//
//   - throughput-N: N closed-loop proposers (256 and 1024); reports binds/s,
//     latency percentiles, binds per log entry and time per entry.
//   - idle-leader, idle-follower: one bind at a time on a quiet cluster.
//   - paced-5000: open-loop load at 5,000 binds/s; latency is measured from
//     each bind's scheduled start (so queueing behind a slow commit counts),
//     and so is the agreement lag (agree-p50-ms, agree-p99-ms): until every
//     node has applied the Bind's entry.
func BenchmarkBindCommit(b *testing.B) {
	newBenchCluster := func(b *testing.B, proposeTimeout time.Duration) *testCluster {
		benchRegs = nil
		return newTestCluster(b, 3, func(i int, c *Config) {
			c.Raft = RaftTiming{} // production defaults
			c.ProposeTimeout = proposeTimeout
			reg := prometheus.NewRegistry()
			benchRegs = append(benchRegs, reg)
			c.Registerer = reg
		})
	}

	for _, proposers := range benchProposers {
		b.Run(fmt.Sprintf("throughput-%d", proposers), func(b *testing.B) { benchThroughput(b, newBenchCluster, proposers) })
	}

	// idle-leader / idle-follower: one proposer, one bind at a time, on
	// the leader or on a follower (forwarded): the latency of a new
	// conversation on a quiet cluster, with its stages.
	for _, where := range []string{"leader", "follower"} {
		b.Run("idle-"+where, func(b *testing.B) {
			tc := newBenchCluster(b, time.Second)
			n := tc.leader(10 * time.Second)
			if where == "follower" {
				n = tc.follower()
			}
			samples := make([]time.Duration, 0, b.N)
			var failed int64
			index0 := n.Status().StateIndex
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				t0 := time.Now()
				if _, err := n.Propose(context.Background(), bindEv(fmt.Sprintf("idle-%d", i), "w1")); err != nil {
					failed++
					continue
				}
				samples = append(samples, time.Since(t0))
			}
			reportRun(b, time.Since(start), samples, failed, n.Status().StateIndex-index0)
		})
	}

	b.Run("paced-5000", func(b *testing.B) {
		tc := newBenchCluster(b, time.Second)
		nodes := tc.running()
		const rate = 5000
		interval := time.Second / rate
		var (
			failed  atomic.Int64
			mu      sync.Mutex
			samples = make([]time.Duration, 0, b.N)
			agreed  = make([]time.Duration, 0, b.N)
			wg      sync.WaitGroup
			slots   = make(chan struct{}, 1024) // bounds goroutines if the cluster falls behind
		)
		index0 := nodes[0].Status().StateIndex
		b.ResetTimer()
		start := time.Now()
		for i := range b.N {
			scheduled := start.Add(time.Duration(i) * interval)
			if d := time.Until(scheduled); d > 0 {
				time.Sleep(d)
			}
			slots <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				n := nodes[i%len(nodes)]
				res, err := n.Propose(context.Background(), bindEv(fmt.Sprintf("paced-%d", i), "w1"))
				if err != nil {
					failed.Add(1)
					return
				}
				lat := time.Since(scheduled)
				// Agreement: every node has applied the Bind's entry.
				idx := n.State().EpochIndex(res.Binding.Epoch)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				for _, o := range nodes {
					_ = o.WaitApplied(ctx, idx)
				}
				cancel()
				agree := time.Since(scheduled)
				mu.Lock()
				samples = append(samples, lat)
				agreed = append(agreed, agree)
				mu.Unlock()
			}()
		}
		wg.Wait()
		reportRun(b, time.Since(start), samples, failed.Load(), nodes[0].Status().StateIndex-index0)
		slices.Sort(agreed)
		if len(agreed) > 0 {
			pct := func(p float64) float64 {
				return float64(agreed[int(p*float64(len(agreed)-1))]) / float64(time.Millisecond)
			}
			b.ReportMetric(pct(0.50), "agree-p50-ms")
			b.ReportMetric(pct(0.99), "agree-p99-ms")
		}
	})
}

// benchThroughput is the closed-loop run: proposers goroutines spread over
// the nodes, each proposing its next bind when the last one returned.
func benchThroughput(b *testing.B, newBenchCluster func(*testing.B, time.Duration) *testCluster, proposers int) {
	tc := newBenchCluster(b, time.Second)
	nodes := tc.running()
	index0 := nodes[0].Status().StateIndex
	elapsed, samples, failed := closedLoop(b, nodes, proposers, "bench")
	reportRun(b, elapsed, samples, failed, nodes[0].Status().StateIndex-index0)
}

// closedLoop runs b.N binds from proposers goroutines spread over nodes,
// each proposing its next bind when the last one returned, and returns the
// wall time, each successful bind's latency and the failures.
func closedLoop(b *testing.B, nodes []*Node, proposers int, prefix string) (time.Duration, []time.Duration, int64) {
	var (
		next    atomic.Int64
		failed  atomic.Int64
		mu      sync.Mutex
		samples = make([]time.Duration, 0, b.N)
		wg      sync.WaitGroup
	)
	b.ResetTimer()
	start := time.Now()
	for p := range proposers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := nodes[p%len(nodes)]
			local := make([]time.Duration, 0, b.N/proposers+1)
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					break
				}
				t0 := time.Now()
				if _, err := n.Propose(context.Background(), bindEv(fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf("w%d", i%16))); err != nil {
					failed.Add(1)
					continue
				}
				local = append(local, time.Since(t0))
			}
			mu.Lock()
			samples = append(samples, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return time.Since(start), samples, failed.Load()
}

// reportRun stops the timer and reports a run's throughput, latency,
// failures and log entries.
func reportRun(b *testing.B, elapsed time.Duration, samples []time.Duration, failed int64, entries uint64) {
	b.StopTimer()
	reportStages(b)
	b.ReportMetric(float64(len(samples))/elapsed.Seconds(), "binds/s")
	reportLatency(b, samples)
	b.ReportMetric(float64(failed), "failed")
	reportEntries(b, entries, len(samples), elapsed)
}

// benchRegs are the bench cluster's registries (one per node).
var benchRegs []*prometheus.Registry

// reportStages reports the mean of each proposal stage over all nodes
// (tether_cluster_propose_stage_seconds), in ms: where a bind's time goes.
func reportStages(b *testing.B) {
	sum, count := map[string]float64{}, map[string]uint64{}
	for _, reg := range benchRegs {
		mfs, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "tether_cluster_propose_stage_seconds" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "stage" {
						sum[l.GetValue()] += m.GetHistogram().GetSampleSum()
						count[l.GetValue()] += m.GetHistogram().GetSampleCount()
					}
				}
			}
		}
	}
	for stage, n := range count {
		if n > 0 {
			b.ReportMetric(sum[stage]/float64(n)*1000, stage+"-mean-ms")
		}
	}
}

func reportLatency(b *testing.B, samples []time.Duration) {
	if len(samples) == 0 {
		return
	}
	slices.Sort(samples)
	pct := func(p float64) float64 {
		i := int(p * float64(len(samples)-1))
		return float64(samples[i]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// benchProposers are the closed-loop concurrencies measured (BENCH_PROPOSERS
// picks one). With one log entry in flight and a round of leader and
// follower fsyncs per entry, throughput is concurrency ÷ commit latency
// (Little's law), so both are reported.
var benchProposers = func() []int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_PROPOSERS")); err == nil && n > 0 {
		return []int{n}
	}
	return []int{256, 1024}
}()

// reportEntries reports how the binds travelled: log entries per second
// and binds per entry (the group commit's batch), which with one entry in
// flight at a time bound the throughput.
func reportEntries(b *testing.B, entries uint64, binds int, elapsed time.Duration) {
	if entries == 0 {
		return
	}
	b.ReportMetric(float64(binds)/float64(entries), "binds/entry")
	b.ReportMetric(elapsed.Seconds()*1000/float64(entries), "ms/entry")
}

// BenchmarkNonvoters: 3 voters and 12 non-voters in one process (loopback,
// fsync on, production Raft timing), 256 closed-loop proposers spread over
// all 15 nodes (four fifths of them on non-voters, forwarding to the
// leader). Besides throughput and latency it reports the non-voters'
// apply lag: every 10 ms the leader's applied index is sampled and a
// non-voter (round robin) timed until it applied that index.
func BenchmarkNonvoters(b *testing.B) {
	benchRegs = nil
	tc := newTestCluster(b, 3, func(i int, c *Config) {
		c.Raft = RaftTiming{}
		c.ProposeTimeout = time.Second
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var nonvoters []*Node
	for k := range 12 {
		nonvoters = append(nonvoters, tc.joinNode(fmt.Sprintf("nv%d", k), tc.leader(10*time.Second).Addr(), SuffrageNonvoter, AutopilotConfig{}))
	}
	tc.sync(30 * time.Second)
	nodes := tc.running()
	leader := tc.leader(10 * time.Second)

	stop := make(chan struct{})
	var lagMu sync.Mutex
	var lags []time.Duration
	var lagWG sync.WaitGroup
	lagWG.Add(1)
	go func() {
		defer lagWG.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			target, t0 := leader.fsm.appliedIndex(), time.Now()
			if err := nonvoters[k%len(nonvoters)].WaitApplied(ctx, target); err == nil {
				lagMu.Lock()
				lags = append(lags, time.Since(t0))
				lagMu.Unlock()
			}
		}
	}()

	const proposers = 256
	index0 := leader.Status().StateIndex
	elapsed, samples, failed := closedLoop(b, nodes, proposers, "nvb")
	close(stop)
	lagWG.Wait()
	reportRun(b, elapsed, samples, failed, leader.Status().StateIndex-index0)
	if len(lags) > 0 {
		slices.Sort(lags)
		b.ReportMetric(float64(lags[len(lags)/2])/float64(time.Millisecond), "apply-lag-p50-ms")
		b.ReportMetric(float64(lags[len(lags)*99/100])/float64(time.Millisecond), "apply-lag-p99-ms")
	}
}
