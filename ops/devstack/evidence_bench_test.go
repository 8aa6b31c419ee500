package devstack

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
)

// BenchmarkLogGrowthPerPlacement measures what a new placement writes to the
// affinity log on a dev stack at its defaults (3 edges, 2+2 workers with 4
// ranks): per new conversation, the payload bytes of its Bind events and of
// the Evidence recorded beside them, and the whole log entries' bytes (the
// archive's record data, every event type and the entry envelope). Metrics:
// bind_B, evidence_B, entries_B per new conversation (both fleets).
func BenchmarkLogGrowthPerPlacement(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	st, err := Start(ctx, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close(context.Background())
	if err := st.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	c := &http.Client{Timeout: 30 * time.Second}
	e := st.Edges()[0].Edge().Node()
	start, _ := e.Archive().LastIndex()
	convs := 0
	for b.Loop() {
		for range 32 {
			body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":"task %d"}]}`,
				st.Model(), strings.Repeat("you are a careful coding agent; ", 30), convs)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, st.Edges()[convs%3].URL()+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("x-session-id", fmt.Sprintf("bench-%d", convs))
			resp, err := c.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("HTTP %d", resp.StatusCode)
			}
			convs++
		}
	}
	b.StopTimer()
	var bind, evidence, entries, binds, evidences int
	measure := func() error {
		bind, evidence, entries, binds, evidences = 0, 0, 0, 0, 0
		return e.Archive().Range(start+1, 0, func(r archive.Record) error {
			entries += len(r.Data)
			props, err := fsm.DecodeEntry(r.Data)
			if err != nil {
				return err
			}
			for _, p := range props {
				switch p.Type {
				case fsm.TypeBind:
					bind += len(p.Raw)
					binds++
				case fsm.TypeEvidence:
					evidence += len(p.Raw)
					evidences++
				}
			}
			return nil
		})
	}
	// The evidence is recorded in the background: wait until every bind
	// has its own (or the deadline).
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := measure(); err != nil {
			b.Fatal(err)
		}
		if evidences >= binds || time.Now().After(deadline) {
			break
		}
	}
	n := float64(convs)
	b.ReportMetric(float64(evidences)/float64(max(binds, 1)), "evidence/bind")
	b.ReportMetric(float64(bind)/n, "bind_B/conv")
	b.ReportMetric(float64(evidence)/n, "evidence_B/conv")
	b.ReportMetric(float64(entries)/n, "entries_B/conv")
	b.ReportMetric(0, "ns/op")
}
