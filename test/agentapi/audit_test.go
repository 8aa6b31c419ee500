package agentapi

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/ops/audit"
	"github.com/tether-project/tether/ops/devstack"
)

// tether audit explain --response: which instance holds a stored response
// and why, from the id and the log of a stopped tether dev.
func TestAuditExplainsStoredResponses(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := devstack.Start(ctx, devstack.Options{Edges: 3, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	key := st.InternalKey()
	e := st.Edges()
	r := do(t, "POST", e[0].URL()+"/v1/responses", map[string]any{"model": st.Model(), "input": "first " + words("w", 80), "prompt_cache_key": "thread-audit"}, nil)
	var first respObj
	decode(t, r.body, &first)
	_, gen := route(t, r)
	r = do(t, "POST", e[1].URL()+"/v1/responses", map[string]any{"model": st.Model(), "input": "second", "previous_response_id": first.ID}, nil)
	var second respObj
	decode(t, r.body, &second)
	// Every edge applied the conversation's Bind before the stack stops.
	deadline := time.Now().Add(20 * time.Second)
	for _, n := range e {
		for {
			if _, ok, _ := n.Binding(ctx, fsm.FleetGeneration, "thread-audit"); ok || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	client.CloseIdleConnections()
	if err := st.Close(ctx); err != nil {
		t.Fatal(err)
	}
	d, err := audit.Open(filepath.Join(dir, "edge-1"), audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ex, err := d.ExplainResponse(ctx, first.ID, []byte(key), "")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	_ = ex.WriteText(&out)
	t.Logf("%s", out.String())
	if ex.Authenticated != "yes" || ex.Instance != gen || ex.Fleet != "generation" || ex.Conversation != "thread-audit" ||
		!strings.Contains(ex.Why, `conversation "thread-audit" was bound to `+gen+" by log entry") &&
			!strings.Contains(ex.Why, `conversation "thread-audit" was new: edge edge-1 placed it on the generation instance `+gen) {
		b, _ := json.Marshal(ex)
		t.Fatalf("first response: %s", b)
	}
	ex, err = d.ExplainResponse(ctx, second.ID, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if ex.Authenticated != "unchecked" || ex.Instance != gen || !ex.Continued || !strings.Contains(ex.Why, "continued a stored response") {
		b, _ := json.Marshal(ex)
		t.Fatalf("second response: %s", b)
	}
	if ex, err := d.ExplainResponse(ctx, first.ID, []byte("another cluster's key"), ""); err != nil || ex.Authenticated != "no" {
		t.Fatalf("with another key: %+v, %v", ex, err)
	}
}
