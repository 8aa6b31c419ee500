package ops

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/ops/audit"
)

// `tether audit explain` on a copied data dir tells why each placement was
// made, from the evidence the deciding edge recorded: a KV-aware placement
// (a second conversation sharing the first one's system prompt goes where
// that prompt is cached) and an overflow (its instance stopped), with the
// candidates' cached blocks, load and state.
func TestExplainShowsPlacementEvidence(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the tether binary")
	}
	bin := tetherBin(t)
	f := startFleet(t, fleetOptions{edges: 1, ctxWorkers: 2, genWorkers: 1})
	f.waitReady(30*time.Second, nil)
	first, err := f.chat(0, "conv-a", "", "plan the work")
	if err != nil {
		t.Fatal(err)
	}
	home := first.contextInstance()
	// The index learns conv-a's blocks from the worker's KV events.
	var second turn
	for deadline := time.Now().Add(20 * time.Second); ; {
		if second, err = f.chat(0, "conv-b-"+time.Now().Format("150405.000000"), "", "plan the work"); err != nil {
			t.Fatal(err)
		}
		if second.contextInstance() == home || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if second.contextInstance() != home {
		t.Fatalf("a conversation sharing conv-a's prompt went to %s, conv-a's prompt is cached on %s", second.contextInstance(), home)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.worker(home).Close(ctx); err != nil {
		t.Fatal(err)
	}
	if third, err := f.chat(0, "conv-a", "", "next step"); err != nil || third.contextInstance() == home {
		t.Fatalf("conv-a after %s stopped: %+v %v", home, third, err)
	}
	f.quiesce()
	dir := filepath.Join(t.TempDir(), "copy")
	copyDir(t, f.edges.Member(0).DataDir, dir)

	out, err := exec.Command(bin, "audit", "explain", "--data-dir", dir, "--key", "conv-a", "--fleet", "context").CombinedOutput()
	t.Logf("explain conv-a:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	for _, want := range []string{"evidence: rule least_loaded;", "evidence: rule overflow:", home + " cached_blocks=", "[chosen]", "[bound"} {
		if !strings.Contains(text, want) {
			t.Errorf("explain conv-a lacks %q", want)
		}
	}
	d, err := audit.Open(dir, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	found := false
	for _, key := range kvAwareKeys(t, d) {
		ex, err := d.Explain(context.Background(), key, audit.ExplainOptions{NoChildren: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range ex.Histories {
			for _, it := range h.Items {
				if ev := it.Evidence; it.Kind == "bind" && ev != nil && ev.Rule == "kv_aware" && len(ev.Candidates) > 0 &&
					ev.Candidates[0].Instance == home && ev.Candidates[0].CachedBlocks > 0 {
					found = true
				}
			}
		}
	}
	if !found {
		t.Errorf("no KV-aware bind with evidence of cached blocks on %s", home)
	}
}

// kvAwareKeys are the context keys other than conv-a (the second
// conversations), from an export of the copy.
func kvAwareKeys(t *testing.T, d *audit.DataDir) []string {
	var b strings.Builder
	if _, err := d.Export(context.Background(), &b, audit.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.Contains(line, `"type":"Evidence"`) && strings.Contains(line, `"rule":"kv_aware"`) {
			i := strings.Index(line, `"key":"`)
			if i < 0 {
				continue
			}
			k := line[i+len(`"key":"`):]
			keys = append(keys, k[:strings.Index(k, `"`)])
		}
	}
	return keys
}
