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
