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
)

// BenchmarkBindCommit measures new-key Binds committed by a 3-node cluster
// on loopback TCP with fsync on (raft-boltdb and the archive), proposers
// spread over all nodes (two thirds of them forward to the leader).
//
//   - throughput: 256 closed-loop proposers; reports binds/s and latency
//     percentiles.
//   - paced-5000: open-loop load at 5,000 binds/s; latency is measured from
//     each bind's scheduled start (so queueing behind a slow commit counts).
func BenchmarkBindCommit(b *testing.B) {
	newBenchCluster := func(b *testing.B, proposeTimeout time.Duration) *testCluster {
		return newTestCluster(b, 3, func(i int, c *Config) {
			c.Raft = RaftTiming{} // production defaults
			c.ProposeTimeout = proposeTimeout
		})
	}

	b.Run("throughput", func(b *testing.B) {
		tc := newBenchCluster(b, time.Second)
		nodes := tc.running()
		proposers := benchProposers
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
					if _, err := n.Propose(context.Background(), bindEv(fmt.Sprintf("bench-%d", i), fmt.Sprintf("w%d", i%16))); err != nil {
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
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(len(samples))/elapsed.Seconds(), "binds/s")
		reportLatency(b, samples)
		b.ReportMetric(float64(failed.Load()), "failed")
	})

	b.Run("paced-5000", func(b *testing.B) {
		tc := newBenchCluster(b, time.Second)
		nodes := tc.running()
		const rate = 5000
		interval := time.Second / rate
		var (
			failed  atomic.Int64
			mu      sync.Mutex
			samples = make([]time.Duration, 0, b.N)
			wg      sync.WaitGroup
			slots   = make(chan struct{}, 1024) // bounds goroutines if the cluster falls behind
		)
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
				if _, err := n.Propose(context.Background(), bindEv(fmt.Sprintf("paced-%d", i), "w1")); err != nil {
					failed.Add(1)
					return
				}
				lat := time.Since(scheduled)
				mu.Lock()
				samples = append(samples, lat)
				mu.Unlock()
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(len(samples))/elapsed.Seconds(), "binds/s")
		reportLatency(b, samples)
		b.ReportMetric(float64(failed.Load()), "failed")
	})
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

var benchProposers = func() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_PROPOSERS")); err == nil && n > 0 {
		return n
	}
	return 256
}()
