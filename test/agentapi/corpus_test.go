package agentapi

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/worker"
)

// The edge and the worker parse every body of the corpus by the same
// request model (internal/apireq): both accept or both refuse it (with the
// same status and parameter), and an accepted prompt has the same block
// keys on both sides — the keys the edge places by are the ones the
// worker's cache stores.
func TestEdgeAndWorkerKeyTheCorpusAlike(t *testing.T) {
	raw, err := os.ReadFile("testdata/corpus.json")
	if err != nil {
		t.Fatal(err)
	}
	var corpus []struct {
		Name string          `json:"name"`
		Path string          `json:"path"`
		Body json.RawMessage `json:"body"`
	}
	if err := json.Unmarshal(raw, &corpus); err != nil {
		t.Fatal(err)
	}
	accepted := map[string]int{}
	for _, c := range corpus {
		eb, eerr := edge.PromptBlocks(c.Path, c.Body, 4)
		wb, werr := worker.PromptBlocks(c.Path, c.Body, 4)
		if (eerr == nil) != (werr == nil) {
			t.Errorf("%s: edge error %v, worker error %v", c.Name, eerr, werr)
			continue
		}
		if eerr != nil {
			ea, wa := eerr.(*apireq.Error), werr.(*apireq.Error)
			if ea.Status != wa.Status || ea.Param != wa.Param {
				t.Errorf("%s: edge refuses %d %q, worker %d %q", c.Name, ea.Status, ea.Param, wa.Status, wa.Param)
			}
			continue
		}
		if len(eb) == 0 {
			t.Errorf("%s: no full block (the corpus needs longer prompts)", c.Name)
		}
		if len(eb) != len(wb) {
			t.Errorf("%s: edge %d blocks, worker %d", c.Name, len(eb), len(wb))
			continue
		}
		for i := range eb {
			if eb[i] != wb[i] {
				t.Errorf("%s: block %d: edge %016x, worker %016x", c.Name, i, eb[i], wb[i])
				break
			}
		}
		accepted[c.Path]++
	}
	for _, p := range []string{"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"} {
		if accepted[p] == 0 {
			t.Errorf("the corpus has no accepted body for %s", p)
		}
	}
}
