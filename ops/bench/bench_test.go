package bench

import (
	"context"
	"testing"
)

// BenchmarkSimulate measures the harness itself: one sim replay of three
// small traces (12 requests) per iteration, tether over the sequencer log.
func BenchmarkSimulate(b *testing.B) {
	w := smallTraces(b)
	cfg := testConfig()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := Simulate(context.Background(), w, cfg); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(12*b.N)/b.Elapsed().Seconds(), "requests/s")
}
