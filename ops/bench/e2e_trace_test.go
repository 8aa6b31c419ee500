package bench

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// tracesDir is the traces' directory as the Makefile's TRACES names it
// (relative to the repository), or TRACES from the environment.
func tracesDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("TRACES")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "shared", "traces", "kv-cache-tester")
	} else if !filepath.IsAbs(dir) {
		dir = filepath.Join("..", "..", dir)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("no traces at %s (set TRACES, see BENCHMARKS.md): %v", dir, err)
	}
	return dir
}

// shortTraceWorkload is a few minutes of real traces: trace_0291 (the
// smallest trace with sub-agents) cut after its first sub-agent returns,
// beside the two conversations of the smallest traces, each started 40 s
// (engine time) after the previous one.
func shortTraceWorkload(t *testing.T) *Workload {
	t.Helper()
	dir := tracesDir(t)
	w, err := LoadTraceFiles([]string{
		filepath.Join(dir, "trace_0291.json.gz"),
	}, TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	small, err := LoadTraces(dir, TraceOptions{Smallest: 2})
	if err != nil {
		t.Fatal(err)
	}
	root := w.Agents[0]
	for i, st := range root.Steps {
		if st.SubAgent != nil {
			root.Steps = root.Steps[:i+2] // the launch and the call after it
			break
		}
	}
	w.Agents = append(w.Agents, small.Agents...)
	for i, a := range w.Agents {
		a.Start = time.Duration(i) * 40 * time.Second
	}
	return w
}

// TestSimPlacesATraceLikeALocalDeployment is TestSimPlacesLikeALocalDeployment
// on real traces (prompts synthesised from the traces' block hashes): the
// same context instance for every request in a 3-edge deployment and in
// the simulator.
func TestSimPlacesATraceLikeALocalDeployment(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local deployment")
	}
	placesLikeADeployment(t, shortTraceWorkload(t), 8192, 0.02)
}
