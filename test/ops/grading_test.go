package ops

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/ops/audit"
	"github.com/tether-project/tether/ops/tune"
)

// sendTurn sends one chat turn of a conversation (system prompt, then the
// turns so far) through edge start (the next ready one on a failure).
func (f *fleet) sendTurn(start int, session, system string, turns []string) error {
	msgs := []map[string]string{{"role": "system", "content": system}}
	for i, t := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": t})
	}
	body, _ := json.Marshal(map[string]any{"model": testModel, "max_tokens": 2, "messages": msgs})
	var last error
	for attempt := range 4 {
		run := f.serving()
		if len(run) == 0 {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		s := run[(start+attempt)%len(run)]
		req, _ := http.NewRequest(http.MethodPost, s.url()+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-session-id", session)
		resp, err := f.client.Do(req)
		if err != nil {
			last = err
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		last = fmt.Errorf("%s via %s: HTTP %d: %s", session, s.id, resp.StatusCode, b)
	}
	return last
}

// A recorded run: agents of four kinds (each kind a long system prompt of
// its own), several conversations each, three turns, through three edges
// onto three context workers. On a copy of an edge's data dir, `tether
// audit accuracy` grades the KV index per instance (the simulated workers'
// own KV events: confirmed claims, nothing degraded), and `tether audit
// tune` ranks turning the cache weight off below the shipped weights.
func TestAuditAccuracyAndTuneOnARecordedRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the tether binary")
	}
	bin := tetherBin(t)
	f := startFleet(t, fleetOptions{edges: 3, ctxWorkers: 3, genWorkers: 1})
	f.waitReady(30*time.Second, nil)
	const kinds, convs, turns = 4, 5, 3
	for turn := 1; turn <= turns; turn++ {
		for c := range convs {
			for k := range kinds {
				system := strings.Repeat(fmt.Sprintf("agent kind %d follows its playbook step by step; ", k), 60)
				var ts []string
				for i := 1; i <= turn; i++ {
					if i > 1 {
						ts = append(ts, fmt.Sprintf("done with step %d of conversation %d-%d", i-1, k, c))
					}
					ts = append(ts, fmt.Sprintf("conversation %d-%d step %d: %s", k, c, i, strings.Repeat("details ", 20)))
				}
				if err := f.sendTurn(k+c+turn, fmt.Sprintf("kind%d-conv%d", k, c), system, ts); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	f.quiesce()
	dir := filepath.Join(t.TempDir(), "copy")
	copyDir(t, f.edges.Member(0).DataDir, dir)

	out, err := exec.Command(bin, "audit", "accuracy", "--data-dir", dir).CombinedOutput()
	t.Logf("audit accuracy:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(bin, "audit", "accuracy", "--data-dir", dir, "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var acc audit.AccuracyReport
	if err := json.Unmarshal(out, &acc); err != nil {
		t.Fatal(err)
	}
	// Every request after the first of each kind had a claim to grade
	// (the prompt spans blocks); all three edges recorded answers.
	if acc.Answers < kinds*convs*turns-kinds || len(acc.Edges) != 3 {
		t.Fatalf("accuracy: %d answers from edges %v, want about %d from 3", acc.Answers, acc.Edges, kinds*convs*turns)
	}
	for _, r := range acc.Rows {
		if r.Source != "tether_worker" {
			t.Fatalf("row %+v: the simulated workers' index learns from their own events", r)
		}
		if r.Claims > 0 && 2*r.ConfirmedClaims <= r.Claims {
			t.Fatalf("row %+v: a healthy worker's claims were not confirmed", r)
		}
	}

	out, err = exec.Command(bin, "audit", "tune", "--data-dir", dir, "--set", "weights.cache=0", "--json").Output()
	if err != nil {
		t.Fatalf("audit tune: %v", err)
	}
	var rep tune.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	text, _ := exec.Command(bin, "audit", "tune", "--data-dir", dir, "--set", "weights.cache=0").Output()
	t.Logf("audit tune:\n%s", text)
	if len(rep.Scores) != 2 || rep.Scores[0].Name != tune.BaseName || rep.Scores[1].Name != "weights.cache=0" {
		t.Fatalf("tune ranking %+v: want the shipped weights above the cache weight off", rep.Scores)
	}
	if rep.Conversations != kinds*convs || len(rep.Instances) != 3 {
		t.Fatalf("tune replayed %d conversations on %v", rep.Conversations, rep.Instances)
	}
}
