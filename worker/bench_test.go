package worker

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/workertest"
)

// BenchmarkChatRoundTrip is one non-streaming chat request over real HTTP
// with the simulator not waiting (TimeScale 0): the worker's own overhead
// (parse, hint verification, scheduling, engine bookkeeping, JSON) plus
// loopback HTTP. Reports the median and p99 latency.
func BenchmarkChatRoundTrip(b *testing.B) {
	for _, signed := range []bool{false, true} {
		name := "plain"
		if signed {
			name = "signed-subagent"
		}
		b.Run(name, func(b *testing.B) {
			cfg := testConfig("bench")
			cfg.ServerRole = hintauth.RoleContext
			s := workertest.Start(b, New, cfg)
			c := testClient(b)
			body := chatBody(longPrompt("bench", 400), `"max_tokens":4`)
			hdr := http.Header{"Content-Type": {"application/json"}, "X-Session-Id": {"child-a"}}
			if signed {
				for k, v := range signedChild("child-a", "parent-1", hintauth.RoleContext, hintauth.RequestAggregated, "") {
					hdr.Set(k, v)
				}
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/chat/completions", strings.NewReader(body))
				req.Header = hdr.Clone()
				start := time.Now()
				resp, err := c.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				lat = append(lat, time.Since(start))
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// BenchmarkParseRequest is body parsing, rendering and tokenization of a
// ~2,300-token agent prompt (docs/agent-workloads.md's typical shared prefix).
func BenchmarkParseRequest(b *testing.B) {
	body := []byte(chatBody(longPrompt("tool", 2300), `"max_tokens":16,"stream":true`))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseRequest(body, apireq.Chat, requestRules{maxModelLen: DefaultMaxModelLen}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoadReport builds and encodes one 8-rank load report.
func BenchmarkLoadReport(b *testing.B) {
	cfg := testConfig("bench")
	cfg.Ranks = 8
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(b.Context())
	p := newPublisher(s)
	b.ReportAllocs()
	for b.Loop() {
		r := p.loadReport(false)
		r.URL = "http://127.0.0.1:1"
		if _, err := encodeLoadForBench(r); err != nil {
			b.Fatal(err)
		}
	}
}

func encodeLoadForBench(r telemetry.LoadReport) ([]byte, error) { return telemetry.EncodeLoad(r) }
