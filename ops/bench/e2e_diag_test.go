package bench

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/ops/devstack"
)

// The TTFT diagnostics of BENCHMARKS.md ("e2e TTFT"): the e2e
// comparison's workload (the traces ending within 1,000 s, staggered over
// 10 min; 4 context workers of 4,500 blocks, 2 generation workers, 3 edges)
// run against local deployments (TestE2ETTFTDiagnostics) and in sim mode
// (TestSimTTFTDiagnostics), each writing its per-request records (and, e2e,
// the edges' and workers' tether_* metrics) as JSON for offline analysis.
// They take minutes, so they run only when asked:
//
//	TETHER_TTFT_DIAG_OUT=/tmp/e2e.json TETHER_TTFT_DIAG_SCALE=0.05 TETHER_TTFT_DIAG_POLICIES=tether,session \
//	  go test -count=1 -timeout 40m -run TestE2ETTFTDiagnostics ./ops/bench/
//	TETHER_TTFT_DIAG_SIM_OUT=/tmp/sim.json go test -count=1 -run TestSimTTFTDiagnostics ./ops/bench/

const ttftDiagTraces = "../../../shared/traces/kv-cache-tester"

func ttftDiagWorkload(t *testing.T) *Workload {
	w, err := LoadTraces(ttftDiagTraces, TraceOptions{MaxDuration: 1000 * time.Second, Stagger: 10 * time.Minute})
	if err != nil {
		t.Skipf("traces not available at %s: %v", ttftDiagTraces, err)
	}
	return w
}

func TestE2ETTFTDiagnostics(t *testing.T) {
	out := os.Getenv("TETHER_TTFT_DIAG_OUT")
	if out == "" {
		t.Skip("a diagnostic run of minutes: set TETHER_TTFT_DIAG_OUT (and TETHER_TTFT_DIAG_SCALE, TETHER_TTFT_DIAG_POLICIES) to run it")
	}
	scale := 0.05
	if v := os.Getenv("TETHER_TTFT_DIAG_SCALE"); v != "" {
		if err := json.Unmarshal([]byte(v), &scale); err != nil || !(scale > 0) {
			t.Fatalf("TETHER_TTFT_DIAG_SCALE=%q: want a number > 0", v)
		}
	}
	genBlocks := 0
	if v := os.Getenv("TETHER_TTFT_DIAG_GEN_BLOCKS"); v != "" {
		if err := json.Unmarshal([]byte(v), &genBlocks); err != nil || genBlocks < 0 {
			t.Fatalf("TETHER_TTFT_DIAG_GEN_BLOCKS=%q: want a block count >= 0", v)
		}
	}
	w := ttftDiagWorkload(t)
	pols := strings.Split(os.Getenv("TETHER_TTFT_DIAG_POLICIES"), ",")
	res := map[string]any{}
	for _, ps := range pols {
		p := Policy(ps)
		var metrics []string
		r, err := ReplayLocalE2E(context.Background(), w, p, LocalE2EOptions{
			Edges: 3, ContextWorkers: 4, GenerationWorkers: 2, Ranks: 1, CapacityBlocks: 4500, TimeScale: scale, Seed: 1, GenerationCapacityBlocks: genBlocks,
			Inspect: func(ctx context.Context, s *devstack.Stack) {
				for _, e := range s.Edges() {
					metrics = append(metrics, scrape(e.URL()+"/metrics"))
				}
				for _, wk := range s.Workers() {
					metrics = append(metrics, scrape(wk.URL()+"/metrics"))
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		res["e2e_"+ps] = r
		res["metrics_"+ps] = metrics
	}
	writeDiag(t, out, res)
}

func writeDiag(t *testing.T, path string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// scrape returns the tether_* samples of a /metrics page.
func scrape(u string) string {
	resp, err := http.Get(u)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "tether_") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func TestSimTTFTDiagnostics(t *testing.T) {
	out := os.Getenv("TETHER_TTFT_DIAG_SIM_OUT")
	if out == "" {
		t.Skip("a diagnostic: set TETHER_TTFT_DIAG_SIM_OUT to write the sim records")
	}
	w := ttftDiagWorkload(t)
	base := DefaultSimConfig()
	base.Instances, base.Ranks, base.CapacityBlocks, base.TimeScale, base.Seed = 4, 1, 4500, 1, 1
	// As CompareE2E: workers report every 100 ms of wall time = 2 s of
	// engine time at scale 0.05.
	base.TelemetryInterval = 2 * time.Second
	rep, err := Replay(context.Background(), w, ReplayOptions{Base: base, Policies: []Policy{PolicyTether, PolicySession}, Edges: []int{3}, KeepRecords: true, Parallel: 1})
	if err != nil {
		t.Fatal(err)
	}
	res := map[string]any{}
	for _, r := range rep.Runs {
		res["sim_"+string(r.Policy)] = r
	}
	writeDiag(t, out, res)
}
