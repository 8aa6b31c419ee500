// Package agents runs a real agent framework, the OpenAI Agents SDK (node,
// from npm), against an in-process tether dev stack (ops/devstack): a
// function tool, a structured output and a handoff to a sub-agent whose
// calls carry the parent-session header. It needs node and npm; without
// them, or without the npm registry, it skips and says why.
package agents

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/ops/devstack"
	"github.com/tether-project/tether/test/crosscheck"
	"github.com/tether-project/tether/test/leakcheck"
	"github.com/tether-project/tether/test/npmenv"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

type call struct {
	Who       string   `json:"who"`
	Status    int      `json:"status"`
	Route     string   `json:"route"`
	Finish    string   `json:"finish"`
	ToolCalls []string `json:"tool_calls"`
	Path      string   `json:"path"`
	// RawUsage is the answer's usage in its API's shape.
	RawUsage json.RawMessage `json:"usage"`
	Error    string          `json:"error"`
}

type report struct {
	Tool struct {
		Error string   `json:"error"`
		Runs  []string `json:"runs"`
		Final string   `json:"final"`
	} `json:"tool"`
	Structured struct {
		Final struct {
			City         string   `json:"city"`
			TemperatureC *float64 `json:"temperature_c"`
			Conditions   string   `json:"conditions"`
			Tags         []string `json:"tags"`
		} `json:"final"`
		Valid bool   `json:"valid"`
		Error string `json:"error"`
	} `json:"structured"`
	Handoff struct {
		Error     string `json:"error"`
		LastAgent string `json:"last_agent"`
		Final     string `json:"final"`
	} `json:"handoff"`
	Calls []call `json:"calls"`
}

func TestAgentsSDK(t *testing.T) {
	modules := installSDK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Mutual TLS as tether dev runs by default: node trusts the stack's CA
	// through NODE_EXTRA_CA_CERTS, as README says.
	st := startStack(t, ctx, devstack.Options{Edges: 1, ContextWorkers: 2, GenerationWorkers: 1, Ranks: 2, MutualTLS: true})

	stdout := runNode(t, ctx, modules, "agents.mjs",
		"TETHER_URL="+st.Edges()[0].URL()+"/v1",
		"TETHER_MODEL="+st.Model(),
		"TETHER_PARENT_HEADER="+devstack.ParentHeader,
		"NODE_EXTRA_CA_CERTS="+st.CAFile())
	var r report
	if err := json.Unmarshal(stdout, &r); err != nil {
		t.Fatalf("script output is not the report (%v):\n%s", err, stdout)
	}
	t.Logf("report: %s", stdout)

	checkAgentsReport(t, r, func(c call) int {
		var u struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		}
		_ = json.Unmarshal(c.RawUsage, &u)
		return u.Details.Cached
	})
}

// checkAgentsReport judges an Agents SDK run: the tool ran with the
// model's arguments, the structured output parsed, the handoff happened
// and the sub-agent's calls landed on the parent's context instance and
// read its cache (cachedOf: a call's cached tokens in its API's usage).
func checkAgentsReport(t *testing.T, r report, cachedOf func(call) int) {
	t.Helper()
	var failed []string
	for name, e := range map[string]string{"tool": r.Tool.Error, "structured output": r.Structured.Error, "handoff": r.Handoff.Error} {
		if e != "" {
			failed = append(failed, name+": "+e)
		}
	}
	if len(failed) > 0 {
		t.Errorf("the SDK failed:\n%s", strings.Join(failed, "\n"))
	}
	// The tool ran, with the arguments the model produced, and the agent
	// answered after it.
	if len(r.Tool.Runs) != 1 || r.Tool.Runs[0] == "" || r.Tool.Final == "" {
		t.Errorf("function tool: runs %q, final %q", r.Tool.Runs, r.Tool.Final)
	}
	// The structured output parsed against its schema.
	if f := r.Structured.Final; !r.Structured.Valid || f.City == "" || f.TemperatureC == nil || f.Conditions != "sunny" || len(f.Tags) == 0 {
		t.Errorf("structured output: %+v", r.Structured)
	}
	// The handoff happened; the sub-agent's calls carried the parent header,
	// landed on the parent's context instance and hit its cache.
	if r.Handoff.LastAgent != "Research agent" || r.Handoff.Final == "" {
		t.Fatalf("handoff: %+v", r.Handoff)
	}
	if t.Failed() {
		return
	}
	parentCtx := map[string]bool{}
	var child []call
	for _, c := range r.Calls {
		if c.Status != 200 || isNullJSON(c.RawUsage) {
			t.Fatalf("call %+v", c)
		}
		inst := contextInstance(t, c.Route)
		if c.Who == "parent" {
			parentCtx[inst] = true
		} else {
			child = append(child, c)
		}
	}
	if len(parentCtx) != 1 {
		t.Fatalf("the parent's calls used context instances %v, want one (its binding)", parentCtx)
	}
	if len(child) == 0 {
		t.Fatal("no sub-agent call recorded")
	}
	for _, c := range child {
		if inst := contextInstance(t, c.Route); !parentCtx[inst] {
			t.Fatalf("sub-agent call on context instance %s, the parent's is %v", inst, parentCtx)
		}
		if cachedOf(c) == 0 {
			t.Fatalf("sub-agent call reported no cached tokens: %+v", c)
		}
	}
}

// contextInstance is the instance of "context=ctx-1/0; generation=gen-1/1".
func contextInstance(t *testing.T, route string) string {
	t.Helper()
	for _, part := range strings.Split(route, ";") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(part), "context="); ok {
			inst, _, _ := strings.Cut(v, "/")
			return inst
		}
	}
	t.Fatalf("no context hop in x-tether-route %q", route)
	return ""
}

// installSDK installs the committed package-lock.json with npm ci into a
// cache directory keyed by the lock's hash (installed once per machine)
// and returns that directory. It skips without node or npm, or when npm
// cannot reach its registry.
func installSDK(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := npmenv.Install(ctx, "testdata", "agents", "package.json", "package-lock.json")
	if errors.Is(err, npmenv.ErrNoNode) || errors.Is(err, npmenv.ErrOffline) {
		crosscheck.Unavailable(t, "the SDK tests need node, npm and the SDKs from npm: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// runNode runs script (with record.mjs and cases.mjs beside it) from testdata in the
// installed modules' directory, so its imports resolve there, and returns
// its standard output.
func runNode(t *testing.T, ctx context.Context, modules, script string, env ...string) []byte {
	t.Helper()
	for _, f := range []string{script, "record.mjs", "cases.mjs"} {
		src, err := os.ReadFile(filepath.Join("testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(modules, f), src, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.CommandContext(ctx, "node", filepath.Join(modules, script))
	cmd.Dir = modules
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %s: %v\nstderr:\n%s\nstdout:\n%s", script, err, stderr.String(), stdout.String())
	}
	return bytes.TrimSpace(stdout.Bytes())
}

// startStack starts a tether dev stack, ready, closed at cleanup.
func startStack(t *testing.T, ctx context.Context, o devstack.Options) *devstack.Stack {
	t.Helper()
	st, err := devstack.Start(ctx, o)
	if err != nil {
		t.Fatalf("devstack: %v", err)
	}
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		if err := st.Close(cctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	if err := st.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return st
}

func isNullJSON(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }
