package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkStartToReady: a whole stack (NATS, 3 edges, 4 workers) from
// Start to WaitReady, then Close. Metrics: median ms to ready and to closed.
func BenchmarkStartToReady(b *testing.B) { benchStartToReady(b, Options{}) }

// BenchmarkStartToReadyMutualTLS is BenchmarkStartToReady with MutualTLS
// (tether dev's default): CA and certificates issued, every link over TLS.
func BenchmarkStartToReadyMutualTLS(b *testing.B) { benchStartToReady(b, Options{MutualTLS: true}) }

// BenchmarkStartToReadyAggregated is BenchmarkStartToReady with one
// aggregated fleet (tether dev --generation-workers 0): 3 edges, 2 workers.
func BenchmarkStartToReadyAggregated(b *testing.B) { benchStartToReady(b, Options{Aggregated: true}) }

func benchStartToReady(b *testing.B, o Options) {
	var ready, closed []float64
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		t0 := time.Now()
		st, err := Start(ctx, o)
		if err != nil {
			cancel()
			b.Fatal(err)
		}
		if err := st.WaitReady(ctx); err != nil {
			cancel()
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := st.Close(ctx); err != nil {
			cancel()
			b.Fatal(err)
		}
		cancel()
		ready = append(ready, float64(t1.Sub(t0).Microseconds())/1000)
		closed = append(closed, float64(time.Since(t1).Microseconds())/1000)
	}
	b.ReportMetric(median(ready), "ms-to-ready")
	b.ReportMetric(median(closed), "ms-to-close")
}

// BenchmarkBoundTurn: one turn of a bound sub-agent conversation through
// an edge (context hop with a signed hint, then the generation hop) on an
// instant engine, so the figure is the control plane's and HTTP's cost.
// Requests rotate over the edges. Metric: median and p99 ms per turn.
func BenchmarkBoundTurn(b *testing.B) { benchBoundTurn(b, Options{}) }

// BenchmarkBoundTurnMutualTLS is BenchmarkBoundTurn over mutual TLS: the
// client → edge, edge → worker (both hops) and NATS links are TLS (kept
// alive, so the figure is encryption, not handshakes).
func BenchmarkBoundTurnMutualTLS(b *testing.B) { benchBoundTurn(b, Options{MutualTLS: true}) }

// BenchmarkBoundTurnAggregated is BenchmarkBoundTurn on an aggregated
// fleet: one hop per turn, to the bound worker.
func BenchmarkBoundTurnAggregated(b *testing.B) { benchBoundTurn(b, Options{Aggregated: true}) }

func benchBoundTurn(b *testing.B, o Options) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	st, err := Start(ctx, o)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close(context.Background())
	if err := st.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 4, TLSClientConfig: st.ClientTLS()}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	body, _ := json.Marshal(map[string]any{
		"model": st.Model(), "max_tokens": 4,
		"messages": []map[string]string{
			{"role": "system", "content": strings.Repeat("tool definitions and instructions ", 500)},
			{"role": "user", "content": "next step"},
		},
	})
	edges := st.Edges()
	send := func(i int, session, parent string) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, edges[i%len(edges)].URL()+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-session-id", session)
		if parent != "" {
			req.Header.Set(ParentHeader, parent)
		}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		return nil
	}
	if err := send(0, "bench-parent", ""); err != nil {
		b.Fatal(err)
	}
	lat := make([]float64, 0, 1024)
	i := 0
	for b.Loop() {
		t0 := time.Now()
		if err := send(i, "bench-child", "bench-parent"); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, float64(time.Since(t0).Microseconds())/1000)
		i++
	}
	b.ReportMetric(median(lat), "ms/turn-p50")
	slices.Sort(lat)
	b.ReportMetric(lat[len(lat)*99/100], "ms/turn-p99")
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
