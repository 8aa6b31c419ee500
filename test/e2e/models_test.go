package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/test/waitfor"
)

// TestTwoModelsThroughTetherDev: `tether dev --models --lora-adapters`
// serves two models on separate fleets, and their adapters, through every
// edge. In each model a parent on edge 1 and its sub-agents on edges 2 and
// 3 share the parent's context instance and rank, on that model's workers;
// the same session ids on the two models are separate bindings, which every
// edge's admin API shows under the model. New conversations of an adapter,
// from any edge, land on the context instance that loaded it. An unknown
// model or adapter is a 404 in OpenAI's shape.
func TestTwoModelsThroughTetherDev(t *testing.T) {
	p := startDev(t, "--models", "tether-sim,tether-sim-b", "--lora-adapters", "tether-sim:agent-a,tether-sim:agent-b,tether-sim-b:agent-c")
	c := p.client(t)
	for i := range 3 {
		ids := modelIDs(t, c, p.edge(i))
		if strings.Join(ids, ",") != "tether-sim,agent-a,agent-b,tether-sim-b,agent-c" {
			t.Fatalf("edge-%d GET /v1/models: %v", i+1, ids)
		}
	}
	explore := "You are an Explore sub-agent. " + words("explore-tools", 300)
	parents := map[string]turn{}
	for _, x := range []struct{ model, prefix string }{{"tether-sim", "ctx-"}, {"tether-sim-b", "m2-ctx-"}} {
		parent := &agent{session: "parent-1", system: "You are the lead agent of " + x.model + ". " + words("lead", 200)}
		childA := &agent{session: "child-a", parent: "parent-1", system: explore}
		childB := &agent{session: "child-b", parent: "parent-1", system: explore}
		p1 := parent.mustSend(t, c, p.edge(0), x.model, "plan the work")
		a1 := childA.mustSend(t, c, p.edge(1), x.model, "explore package routing")
		b1 := childB.mustSend(t, c, p.edge(2), x.model, "explore package edge")
		if !strings.HasPrefix(p1.ctxInst, x.prefix) {
			t.Fatalf("%s: parent on %s, not on the model's own context workers (%s*)", x.model, p1.ctxInst, x.prefix)
		}
		if a1.ctxInst != p1.ctxInst || b1.ctxInst != p1.ctxInst || a1.ctxRank != p1.ctxRank || b1.ctxRank != p1.ctxRank {
			t.Fatalf("%s: parent %s/%s, child-a %s/%s, child-b %s/%s; want the parent's instance and rank",
				x.model, p1.ctxInst, p1.ctxRank, a1.ctxInst, a1.ctxRank, b1.ctxInst, b1.ctxRank)
		}
		r2 := parent.mustSend(t, c, p.edge(2), x.model, "continue")
		if r2.ctxInst != p1.ctxInst || r2.cached == 0 {
			t.Fatalf("%s: parent turn 2 on %s (turn 1 %s), cached %d", x.model, r2.ctxInst, p1.ctxInst, r2.cached)
		}
		parents[x.model] = p1
	}
	for i := range 3 {
		for model, p1 := range parents {
			q := ""
			if model != "tether-sim" {
				q = "?model=" + url.QueryEscape(model)
			}
			// Placements commit beside the requests: wait until each
			// edge applied it.
			waitfor.Reason(t, 30*time.Second, fmt.Sprintf("edge-%d's context binding of parent-1 on %s", i+1, model), func() string {
				b, ok := adminBinding(t, c, p.edge(i), p.token, "context", "parent-1"+q)
				if !ok || b.Instance != p1.ctxInst || b.Model != model || b.ModelKey != "parent-1" {
					return fmt.Sprintf("%+v (found %v), want %s", b, ok, p1.ctxInst)
				}
				return ""
			})
		}
	}
	for _, x := range []struct{ adapter, prefix string }{{"agent-a", "ctx-"}, {"agent-b", "ctx-"}, {"agent-c", "m2-ctx-"}} {
		first := (&agent{session: x.adapter + "-0", system: "You are " + x.adapter + ". " + words(x.adapter+"-0", 100)}).
			mustSend(t, c, p.edge(0), x.adapter, "start")
		if !strings.HasPrefix(first.ctxInst, x.prefix) {
			t.Fatalf("%s on %s, not its model's workers (%s*)", x.adapter, first.ctxInst, x.prefix)
		}
		// Every edge hears the worker's report that it holds the adapter.
		waitfor.True(t, 30*time.Second, x.adapter+" loaded on "+first.ctxInst+" in every edge's view", func() bool {
			for i := range 3 {
				if !instanceHolds(t, c, p.edge(i), p.token, first.ctxInst, x.adapter) {
					return false
				}
			}
			return true
		})
		for i := 1; i <= 3; i++ {
			a := &agent{session: fmt.Sprintf("%s-%d", x.adapter, i), system: "You are " + x.adapter + ". " + words(fmt.Sprintf("%s-%d", x.adapter, i), 100)}
			tr := a.mustSend(t, c, p.edge(i%3), x.adapter, "start")
			if tr.ctxInst != first.ctxInst {
				t.Fatalf("%s conversation %d via edge-%d on %s; the adapter is loaded on %s", x.adapter, i, i%3+1, tr.ctxInst, first.ctxInst)
			}
		}
	}
	for _, model := range []string{"no-such-model", "agent-z"} {
		resp, err := c.Post(p.edge(1)+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		expectModelNotFound(t, resp)
	}
	p.stop(t)
}

// instanceHolds reports whether edge base's admin API shows instance
// holding adapter.
func instanceHolds(t *testing.T, c *http.Client, base, token, instance, adapter string) bool {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/admin/v1/instances", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Instances []admin.InstanceInfo `json:"instances"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	for _, in := range out.Instances {
		if in.ID == instance && in.LoRA != nil && slices.Contains(in.LoRA.Loaded, adapter) {
			return true
		}
	}
	return false
}

func modelIDs(t *testing.T, c *http.Client, base string) []string {
	t.Helper()
	resp, err := c.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range list.Data {
		ids = append(ids, d.ID)
	}
	return ids
}

// expectModelNotFound checks OpenAI's answer to an unknown model: 404,
// {"error": {"type": "invalid_request_error", "param": "model", "code":
// "model_not_found", …}}.
func expectModelNotFound(t *testing.T, resp *http.Response) {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct {
		Error struct {
			Type  string `json:"type"`
			Param string `json:"param"`
			Code  string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != http.StatusNotFound ||
		e.Error.Type != "invalid_request_error" || e.Error.Param != "model" || e.Error.Code != "model_not_found" {
		t.Fatalf("want 404 model_not_found, got %d %s", resp.StatusCode, b)
	}
}
