package bench

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestMetrics(t *testing.T) {
	if got := CoV([]int64{10, 10, 10}); got != 0 {
		t.Fatalf("CoV of equal loads %v", got)
	}
	if got := CoV([]int64{0, 20}); math.Abs(got-1) > 1e-12 {
		t.Fatalf("CoV [0 20] = %v, want 1", got)
	}
	ds := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if Percentile(ds, 0.5) != 5 || Percentile(ds, 0.99) != 10 || Percentile(nil, 0.5) != 0 {
		t.Fatal("nearest-rank percentiles")
	}
	r := &RunResult{Records: []RequestRecord{
		{Root: "a", Prompt: 100}, {Root: "b", Prompt: 60, Cached: 10}, {Root: "c", Prompt: 50}, {Root: "b", Agent: "b/sub", Prompt: 5, Cached: 5},
	}}
	// Jobs a=100, b=50, c=50 on two instances: 100 | 50+50.
	if got := StickyBalanceBound(r, 2); got != 0 {
		t.Fatalf("sticky bound %v, want 0", got)
	}
	if got := StickyBalanceBound(r, 3); math.Abs(got-CoV([]int64{100, 50, 50})) > 1e-12 {
		t.Fatalf("sticky bound on 3 instances %v", got)
	}
}

func TestReplaceSectionsKeepsHandWrittenText(t *testing.T) {
	doc := "# T\nintro\n<!-- tether-bench:begin a -->\nold a\n<!-- tether-bench:end a -->\nmiddle\n<!-- tether-bench:begin b -->\n<!-- tether-bench:end b -->\ntail\n"
	out, err := ReplaceSections(doc, map[string]string{"a": "new a\n", "b": "new b"})
	if err != nil {
		t.Fatal(err)
	}
	want := "# T\nintro\n<!-- tether-bench:begin a -->\nnew a\n<!-- tether-bench:end a -->\nmiddle\n<!-- tether-bench:begin b -->\nnew b\n<!-- tether-bench:end b -->\ntail\n"
	if out != want {
		t.Fatalf("got\n%s\nwant\n%s", out, want)
	}
	if _, err := ReplaceSections(doc, map[string]string{"missing": "x"}); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing section: %v", err)
	}
}

func TestParseGoBenchTakesMedians(t *testing.T) {
	out := `goos: linux
pkg: github.com/tether-project/tether/fsm
BenchmarkApply-2   	 1000	 300 ns/op	 64 B/op	 2 allocs/op
BenchmarkApply-2   	 1000	 100 ns/op	 64 B/op	 2 allocs/op
BenchmarkApply-2   	 1000	 200 ns/op	 64 B/op	 2 allocs/op
BenchmarkApply-2 some log line
pkg: github.com/tether-project/tether/routing
BenchmarkRoute/sticky-2  	 5000	 50.5 ns/op	 7.0 p50-us
PASS
`
	res, err := ParseGoBench(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || res[0].Name != "BenchmarkApply" || res[0].Runs != 3 || res[0].Metrics["ns/op"] != 200 {
		t.Fatalf("results %+v", res)
	}
	if res[1].Package != "github.com/tether-project/tether/routing" || res[1].Metrics["p50-us"] != 7 {
		t.Fatalf("second result %+v", res[1])
	}
	if tbl := MicroTable(res, "github.com/tether-project/tether"); !strings.Contains(tbl, "| fsm | BenchmarkApply | 3 | 200 | 64 | 2 |") {
		t.Fatalf("table:\n%s", tbl)
	}
}
