package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// appliedCounts is what an edge's archive says about the proposals it
// holds: how many carried an id, how many were applied and how many were
// answered as duplicates of an id applied before, and the ids applied more
// than once (there must be none).
type appliedCounts struct {
	events, applied, duplicate int
	twice                      []string
}

// archiveApplied exports a copy of e's archive (`tether audit export`) and
// counts, per proposal id, the records applied.
func (v *env) archiveApplied(e *edgeProc) appliedCounts {
	v.t.Helper()
	cp := filepath.Join(v.dir, fmt.Sprintf("export-%s-%d", e.id, time.Now().UnixNano()))
	if out, err := exec.Command("cp", "-r", e.dataDir, cp).CombinedOutput(); err != nil {
		v.t.Fatalf("copy %s: %v: %s", e.dataDir, err, out)
	}
	defer os.RemoveAll(cp)
	var out, errOut bytes.Buffer
	cmd := exec.Command(tetherBin, "audit", "export", "--data-dir", cp)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		v.t.Fatalf("tether audit export of %s: %v\n%s", e.id, err, errOut.String())
	}
	var c appliedCounts
	seen := map[string]int{}
	sc := bufio.NewScanner(&out)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var ev struct {
			ProposalID string `json:"proposal_id"`
			Type       string `json:"type"`
			Effects    struct {
				Status string `json:"status"`
			} `json:"effects"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			v.t.Fatalf("export of %s: %v: %s", e.id, err, sc.Bytes())
		}
		if ev.ProposalID == "" {
			continue
		}
		c.events++
		switch ev.Effects.Status {
		case "applied":
			c.applied++
			if seen[ev.ProposalID]++; seen[ev.ProposalID] == 2 {
				c.twice = append(c.twice, ev.Type+" "+ev.ProposalID)
			}
		case "duplicate":
			c.duplicate++
		}
	}
	if err := sc.Err(); err != nil {
		v.t.Fatalf("export of %s: %v", e.id, err)
	}
	return c
}

// proposalsApplied sums tether_edge_proposals_total{result="applied"} over
// e's /metrics: the proposals the edge saw applied.
func (v *env) proposalsApplied(ctx context.Context, e *edgeProc) (int, error) {
	n, err := v.metricSum(ctx, e, "tether_edge_proposals_total", `result="applied"`)
	return int(n), err
}

// metricSum sums the samples of a series of e's /metrics whose labels
// contain every one of match (`name="value"`).
func (v *env) metricSum(ctx context.Context, e *edgeProc, name string, match ...string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", e.url()+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := v.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("%s /metrics: HTTP %d: %s", e.id, resp.StatusCode, b)
	}
	n := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
scan:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, m := range match {
			if !strings.Contains(line, m) {
				continue scan
			}
		}
		f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("%s /metrics: %q: %w", e.id, line, err)
		}
		n += f
	}
	return n, sc.Err()
}
