package devstack

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
)

var readmeEpoch = regexp.MustCompile(`"epoch":(\d+)`)

// The README's admin example shows an epoch of the form a dev stack serves
// (entry index << 16 | position + 1, at the feature level tether dev runs;
// before: 9, a level-1 epoch no stack shows), says where the traces come
// from and names tokenizer files that exist.
func TestREADMEMatchesTheDevStack(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	m := readmeEpoch.FindStringSubmatch(readme)
	if m == nil {
		t.Fatal("README shows no binding epoch")
	}
	doc, _ := strconv.ParseUint(m[1], 10, 64)
	if doc>>16 == 0 || doc&0xffff == 0 {
		t.Errorf("README epoch %d is not entry<<16 | position+1", doc)
	}
	if !strings.Contains(readme, strconv.FormatUint(doc>>16, 10)+" << 16 | "+strconv.FormatUint(doc&0xffff, 10)) {
		t.Errorf("README does not explain its epoch %d as %d << 16 | %d", doc, doc>>16, doc&0xffff)
	}
	for _, want := range []string{"callanjfox/kv-cache-tester", "internal/hftok/testdata/qwen3/tokenizer.json.gz"} {
		if !strings.Contains(readme, want) {
			t.Errorf("README does not mention %s", want)
		}
	}
	if _, err := os.Stat(filepath.Join("..", "..", "internal", "hftok", "testdata", "qwen3", "tokenizer.json.gz")); err != nil {
		t.Errorf("the tokenizer file the README names: %v", err)
	}

	st := startStack(t, Options{})
	c := stackClient(t, st)
	// The README's epoch is of feature level 2, which the new cluster's
	// leader commits right after its election (a new key placed before
	// that gets a level-1 epoch).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitUntil(t, ctx, "feature level 2", func() bool {
		return st.Edges()[0].Edge().Node().State().FeatureLevel() >= fsm.FeatureLevelRanks
	})
	chat(t, c, st, st.Edges()[0], "parent-1", "", "plan the work")
	bi, ok := binding(t, st.Edges()[2], fsm.FleetContext, "parent-1")
	if !ok {
		t.Fatal("no binding for parent-1")
	}
	if bi.Epoch>>16 == 0 || bi.Epoch&0xffff == 0 {
		t.Errorf("the dev stack served epoch %d, not of the README's form", bi.Epoch)
	}
	t.Logf("README epoch %d; served %d (entry %d, proposal %d)", doc, bi.Epoch, bi.Epoch>>16, bi.Epoch&0xffff-1)
}

// readmeTopologyRow is a row of the README's table of tether dev
// topologies: its flags and the x-tether-route it shows.
var readmeTopologyRow = regexp.MustCompile("(?m)^\\| (\\(default\\)|`[^`|]*`) \\| [^|]+ \\| `(context=[^`]*)` \\|$")

// routeShape is the hops of a route header without instance numbers and
// ranks: "context=ctx-N/R; generation=-".
func routeShape(route string) string {
	parts := strings.SplitN(route, ";", 3)
	if len(parts) > 2 {
		parts = parts[:2]
	}
	return regexp.MustCompile(`-\d+/\d+`).ReplaceAllString(strings.Join(parts, ";"), "-N/R")
}

// Each row of the README's topology table (tether dev's worker flags) is
// the stack those flags build: a request's x-tether-route has the hops the
// row shows.
func TestREADMETopologies(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a stack per topology")
	}
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := readmeTopologyRow.FindAllStringSubmatch(string(b), -1)
	if len(rows) != 4 {
		t.Fatalf("README's topology table has %d rows, want 4 (default, --generation-workers 0, --engine-events vllm, both)", len(rows))
	}
	for _, row := range rows {
		o := Options{Edges: 1, ContextWorkers: 1, GenerationWorkers: 1, Ranks: 1}
		flags := strings.Fields(strings.Trim(row[1], "`"))
		if row[1] == "(default)" {
			flags = nil
		}
		for i := 0; i+1 < len(flags); i += 2 {
			switch flag, v := flags[i], flags[i+1]; {
			case flag == "--generation-workers" && v == "0":
				o.Aggregated, o.GenerationWorkers = true, 0
			case flag == "--engine-events":
				o.EngineEvents = v
			default:
				t.Fatalf("README topology row %q: flag %s %s is not one this test builds", row[1], flag, v)
			}
		}
		st := startStack(t, o)
		got := chat(t, stackClient(t, st), st, st.Edges()[0], "topology", "", "hello")
		if routeShape(got.route) != routeShape(row[2]) {
			t.Errorf("README topology %s shows %q; the stack answered %q", row[1], row[2], got.route)
		}
		closeStack(t, st)
	}
}
