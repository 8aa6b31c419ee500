package agents

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/ops/audit"
	"github.com/tether-project/tether/ops/devstack"
	"github.com/tether-project/tether/test/crosscheck"
	"github.com/tether-project/tether/test/npmenv"
	"github.com/tether-project/tether/test/waitfor"
)

// The real agent CLIs, Claude Code and Codex, at the versions
// testdata/clis/package-lock.json pins, with their defaults and the
// settings README gives ("Claude Code, Codex and the Agents SDK through
// tether") and nothing else, against a tether dev stack with its defaults
// (three edges, mutual TLS): each finishes a small task in a temporary
// directory (a tool call, its result, a final answer, exit status 0), and
// a resumed session through another edge stays on its context instance.

// clis are the installed CLIs' programs.
type clis struct{ claude, codex string }

// installCLIs installs the pinned CLIs (once per machine, into the user's
// cache). Claude Code's postinstall puts its native binary in place, so
// its install script is trusted.
func installCLIs(t *testing.T) clis {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir, err := npmenv.InstallTrusting(ctx, filepath.Join("testdata", "clis"), "agent-clis", []string{"@anthropic-ai/claude-code"}, "package.json", "package-lock.json")
	if errors.Is(err, npmenv.ErrNoNode) || errors.Is(err, npmenv.ErrOffline) {
		crosscheck.Unavailable(t, "the CLI tests need node, npm and the CLIs from npm: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "node_modules", ".bin")
	return clis{claude: filepath.Join(bin, "claude"), codex: filepath.Join(bin, "codex")}
}

// cliEnv is the environment a CLI runs in: this process's, without any
// setting of the CLIs' own that the host may carry, with a fresh HOME (no
// earlier session, login or configuration) and the given settings.
func cliEnv(t *testing.T, home string, settings ...string) []string {
	t.Helper()
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "HOME", k == "CODEX_HOME", k == "SSL_CERT_FILE", k == "NODE_EXTRA_CA_CERTS",
			strings.HasPrefix(k, "ANTHROPIC_"), strings.HasPrefix(k, "CLAUDE_"), strings.HasPrefix(k, "OPENAI_"):
			continue
		}
		env = append(env, kv)
	}
	return append(env, append([]string{"HOME=" + home}, settings...)...)
}

// runCLI runs a CLI in dir and returns its standard output; a non-zero
// exit fails the test with both outputs.
func runCLI(t *testing.T, ctx context.Context, dir string, env []string, prog string, args ...string) []byte {
	t.Helper()
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdin = strings.NewReader("")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\nstderr:\n%s\nstdout:\n%s", filepath.Base(prog), strings.Join(args, " "), err, tailOf(stderr.String(), 4000), tailOf(stdout.String(), 8000))
	}
	return stdout.Bytes()
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// jsonLines decodes each line of out that is a JSON object.
func jsonLines(out []byte) []map[string]any {
	var lines []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			lines = append(lines, m)
		}
	}
	return lines
}

// taskDir is a temporary working directory holding notes.txt with marker.
func taskDir(t *testing.T, marker string) (dir, notes string) {
	t.Helper()
	dir = t.TempDir()
	notes = filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(notes, []byte("The release marker is "+marker+".\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, notes
}

// claudeRun is what one `claude -p --output-format stream-json` run showed.
type claudeRun struct {
	session   string
	toolUses  []map[string]any // tool_use blocks of the main agent's turns
	results   []string         // tool_result contents (errors prefixed "error: ")
	final     map[string]any   // the result message
	subagents int              // messages of sub-agents (parent_tool_use_id set)
}

func parseClaude(t *testing.T, out []byte) claudeRun {
	t.Helper()
	var r claudeRun
	for _, m := range jsonLines(out) {
		if s, _ := m["session_id"].(string); s != "" {
			r.session = s
		}
		msg, _ := m["message"].(map[string]any)
		if p, _ := m["parent_tool_use_id"].(string); p != "" {
			r.subagents++
			continue
		}
		content, _ := msg["content"].([]any)
		for _, c := range content {
			b, _ := c.(map[string]any)
			switch b["type"] {
			case "tool_use":
				r.toolUses = append(r.toolUses, b)
			case "tool_result":
				text := flattenResult(b["content"])
				if e, _ := b["is_error"].(bool); e {
					text = "error: " + text
				}
				r.results = append(r.results, text)
			}
		}
		if m["type"] == "result" {
			r.final = m
		}
	}
	if r.final == nil {
		t.Fatalf("claude printed no result message:\n%s", tailOf(string(out), 8000))
	}
	return r
}

// flattenResult is a tool_result's content as text.
func flattenResult(v any) string {
	switch c := v.(type) {
	case string:
		return c
	case []any:
		var b strings.Builder
		for _, p := range c {
			if m, ok := p.(map[string]any); ok {
				s, _ := m["text"].(string)
				b.WriteString(s)
			}
		}
		return b.String()
	}
	return fmt.Sprint(v)
}

// checkClaudeTask: the run called Read on notes, got the file's content
// back, and ended with a successful answer.
func checkClaudeTask(t *testing.T, r claudeRun, notes, marker string) {
	t.Helper()
	read := false
	for _, u := range r.toolUses {
		in, _ := u["input"].(map[string]any)
		if u["name"] == "Read" && in["file_path"] == notes {
			read = true
		}
	}
	if !read {
		t.Errorf("no Read of %s among the tool calls %v", notes, r.toolUses)
	}
	got := false
	for _, res := range r.results {
		if strings.Contains(res, marker) && !strings.HasPrefix(res, "error: ") {
			got = true
		}
	}
	if !got {
		t.Errorf("no tool result holds the file's marker %s: %q", marker, r.results)
	}
	if r.final["subtype"] != "success" || r.final["is_error"] != false {
		t.Errorf("the run did not end in a successful answer: %v", r.final)
	}
	if s, _ := r.final["result"].(string); strings.TrimSpace(s) == "" {
		t.Errorf("empty final answer: %v", r.final)
	}
}

// Claude Code (`claude -p`) with its defaults (max_tokens 32000, its own
// tools, system reminders, inline system messages) reads a file with its
// Read tool and answers, through edge-1; the session resumed through
// edge-2 (`--resume`) does it again; both runs' requests stay on one
// context instance, which every edge's binding of the session names.
func TestClaudeCodeFinishesATask(t *testing.T) {
	bins := installCLIs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	st := startStack(t, ctx, devstack.Options{MutualTLS: true})
	edges := st.Edges()
	const marker = "tether-7f3a"
	work, notes := taskDir(t, marker)
	home := t.TempDir()
	settings := func(edge string) []string {
		return cliEnv(t, home, exports(t, readmeBlock(t, st, edge, "readme-claude-code"))...)
	}
	prompt := "Use the Read tool on `" + notes + "` and tell me what it says."
	first := parseClaude(t, runCLI(t, ctx, work, settings(edges[0].URL()), bins.claude, "-p", "--output-format", "stream-json", "--verbose", prompt))
	checkClaudeTask(t, first, notes, marker)
	if first.session == "" {
		t.Fatal("no session id in claude's output")
	}
	inst := sessionInstance(t, st, first.session)

	again := parseClaude(t, runCLI(t, ctx, work, settings(edges[1].URL()), bins.claude, "-p", "--resume", first.session, "--output-format", "stream-json", "--verbose", prompt))
	checkClaudeTask(t, again, notes, marker)
	if got := sessionInstance(t, st, first.session); got != inst {
		t.Errorf("resumed through edge-2, the session moved from %s to %s", inst, got)
	}
	assertOnePlacement(t, st, first.session)
}

// codexRun is what one `codex exec --json` run showed.
type codexRun struct {
	thread   string
	commands []map[string]any // command_execution items, completed
	messages []string         // agent_message texts
	errors   []string         // error events and failed turns
	warnings []string         // error items: the CLI's own notices, e.g. no metadata for the model's name
	turns    int              // turn.completed events
}

func parseCodex(t *testing.T, out []byte) codexRun {
	t.Helper()
	var r codexRun
	for _, m := range jsonLines(out) {
		switch m["type"] {
		case "thread.started":
			r.thread, _ = m["thread_id"].(string)
		case "item.completed":
			it, _ := m["item"].(map[string]any)
			switch it["type"] {
			case "command_execution":
				r.commands = append(r.commands, it)
			case "agent_message":
				s, _ := it["text"].(string)
				r.messages = append(r.messages, s)
			case "error":
				s, _ := it["message"].(string)
				r.warnings = append(r.warnings, s)
			}
		case "turn.completed":
			r.turns++
		case "error", "turn.failed":
			b, _ := json.Marshal(m)
			r.errors = append(r.errors, string(b))
		}
	}
	return r
}

// checkCodexTask: the run executed the command, its output held the
// marker, and the turn ended with an answer and no error.
func checkCodexTask(t *testing.T, r codexRun, marker string, out []byte) {
	t.Helper()
	ran := false
	for _, c := range r.commands {
		cmd, _ := c["command"].(string)
		output, _ := c["aggregated_output"].(string)
		if strings.Contains(cmd, "cat notes.txt") && strings.Contains(output, marker) {
			ran = true
		}
	}
	if !ran {
		t.Errorf("no `cat notes.txt` whose output holds %s among %v\n%s", marker, r.commands, tailOf(string(out), 6000))
	}
	if len(r.errors) > 0 {
		t.Errorf("errors: %q", r.errors)
	}
	if len(r.warnings) > 0 {
		t.Logf("codex's notices: %q", r.warnings)
	}
	if r.turns != 1 || len(r.messages) == 0 || strings.TrimSpace(r.messages[len(r.messages)-1]) == "" {
		t.Errorf("%d completed turns, answers %q; want one turn ending in an answer", r.turns, r.messages)
	}
}

// Codex (`codex exec`) with its defaults (namespace and web_search tools,
// store false, encrypted reasoning asked for) and README's provider runs a
// command and answers through edge-1; the session resumed through edge-3
// does it again on the same context instance.
func TestCodexFinishesATask(t *testing.T) {
	bins := installCLIs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	st := startStack(t, ctx, devstack.Options{MutualTLS: true})
	edges := st.Edges()
	const marker = "tether-91bd"
	work, _ := taskDir(t, marker)
	if out, err := exec.Command("git", "-C", work, "init", "-q").CombinedOutput(); err != nil {
		t.Fatalf("git init: %v %s", err, out)
	}
	home := t.TempDir()
	codexHome := filepath.Join(home, ".codex")
	if err := os.MkdirAll(codexHome, 0o700); err != nil {
		t.Fatal(err)
	}
	config := readmeBlock(t, st, edges[0].URL(), "readme-codex-config")
	if err := os.WriteFile(filepath.Join(codexHome, "config.toml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	env := cliEnv(t, home, exports(t, readmeBlock(t, st, edges[0].URL(), "readme-codex-env"))...)
	prompt := "Use exec_command to run `cat notes.txt` and tell me what it says."
	out := runCLI(t, ctx, work, env, bins.codex, "exec", "--json", prompt)
	first := parseCodex(t, out)
	checkCodexTask(t, first, marker, out)
	if first.thread == "" {
		t.Fatalf("no thread id in codex's output:\n%s", tailOf(string(out), 4000))
	}
	inst := sessionInstance(t, st, first.thread)

	out = runCLI(t, ctx, work, env, bins.codex, "exec", "--json",
		"-c", `model_providers.tether.base_url="`+edges[2].URL()+`/v1"`, "resume", first.thread, prompt)
	again := parseCodex(t, out)
	checkCodexTask(t, again, marker, out)
	if got := sessionInstance(t, st, first.thread); got != inst {
		t.Errorf("resumed through edge-3, the thread moved from %s to %s", inst, got)
	}
	assertOnePlacement(t, st, first.thread)
}

// sessionInstance is the context instance every edge's binding of key
// names, once they all agree (bindings replicate through the log).
func sessionInstance(t *testing.T, st *devstack.Stack, key string) string {
	t.Helper()
	var inst string
	waitfor.Reason(t, 30*time.Second, "every edge binds "+key+" to one context instance", func() string {
		inst = ""
		for _, n := range st.Edges() {
			b, found, err := n.Binding(context.Background(), fsm.FleetContext, key)
			switch {
			case err != nil:
				return err.Error()
			case !found:
				return n.ID + " has no binding of " + key
			case inst != "" && b.Instance != inst:
				return fmt.Sprintf("%s binds it to %s, another edge to %s", n.ID, b.Instance, inst)
			}
			inst = b.Instance
		}
		return ""
	})
	return inst
}

// assertOnePlacement: the log placed key on the context fleet once and
// never moved it (no rebind, no overflow) while the CLI ran.
func assertOnePlacement(t *testing.T, st *devstack.Stack, key string) {
	t.Helper()
	var hist struct {
		Events        []admin.HistoryEntry `json:"events"`
		ArchiveBehind bool                 `json:"archive_behind"`
	}
	waitfor.Reason(t, 30*time.Second, "edge-1's archive holds "+key+"'s history", func() string {
		if err := st.Edges()[0].AdminGet(context.Background(), "bindings/context/"+url.PathEscape(key)+"/history", &hist); err != nil {
			return err.Error()
		}
		if hist.ArchiveBehind {
			return "the archive is behind the state"
		}
		return ""
	})
	placements := 0
	for _, h := range hist.Events {
		if (h.Type == fsm.TypeBind.String() || h.Type == fsm.TypeOverflow.String()) && h.Status == "applied" {
			placements++
		}
	}
	if placements != 1 {
		b, _ := json.Marshal(hist.Events)
		t.Errorf("the session's context placements: %d, want 1; history %s", placements, b)
	}
}

// README's example commands for Claude Code and Codex run as written
// (bash, the CLIs on PATH, Codex's config.toml from README in ~/.codex) in
// a directory holding a README.md, and exit 0.
func TestReadmeClientExamples(t *testing.T) {
	bins := installCLIs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	st := startStack(t, ctx, devstack.Options{MutualTLS: true})
	edge := st.Edges()[0].URL()
	work, _ := taskDir(t, "readme")
	if err := os.WriteFile(filepath.Join(work, "README.md"), []byte("# a project\nIt prints hello.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("git", "-C", work, "init", "-q").CombinedOutput(); err != nil {
		t.Fatalf("git init: %v %s", err, out)
	}
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, ".codex"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".codex", "config.toml"), []byte(readmeBlock(t, st, edge, "readme-codex-config")), 0o600); err != nil {
		t.Fatal(err)
	}
	path := "PATH=" + filepath.Dir(bins.claude) + string(os.PathListSeparator) + os.Getenv("PATH")
	for _, marker := range []string{"readme-claude-code", "readme-codex-env"} {
		out := runCLI(t, ctx, work, cliEnv(t, home, path), "bash", "-euo", "pipefail", "-c", readmeBlock(t, st, edge, marker))
		if strings.TrimSpace(string(out)) == "" {
			t.Errorf("%s: the example printed nothing", marker)
		}
	}
}

// Claude Code's Task sub-agents are sub-agents in tether: `claude -p`
// asked to use its Agent tool spawns one (x-claude-code-agent-id under the
// session), which reads the file with its own Read tool and reports back;
// the parent answers. In the log the sub-agent is a child of the session
// (`tether audit explain` lists it), it ran on the session's context
// instance and has a generation binding of its own.
func TestClaudeCodeSubAgents(t *testing.T) {
	bins := installCLIs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dataDir := t.TempDir()
	st := startStack(t, ctx, devstack.Options{MutualTLS: true, DataDir: dataDir})
	edges := st.Edges()
	const marker = "tether-c2d8"
	work, notes := taskDir(t, marker)
	env := cliEnv(t, t.TempDir(), exports(t, readmeBlock(t, st, edges[2].URL(), "readme-claude-code"))...)
	prompt := "Use the Agent tool: `read the notes` ``Use the Read tool on `" + notes + "` and report what it says.``"
	out := runCLI(t, ctx, work, env, bins.claude, "-p", "--output-format", "stream-json", "--verbose", prompt)
	r := parseClaude(t, out)
	spawned := false
	for _, u := range r.toolUses {
		if u["name"] == "Agent" || u["name"] == "Task" {
			spawned = true
		}
	}
	if !spawned || r.subagents == 0 {
		t.Fatalf("no sub-agent ran (tool calls %v, %d sub-agent messages):\n%s", r.toolUses, r.subagents, tailOf(string(out), 8000))
	}
	if !strings.Contains(string(out), marker) {
		t.Errorf("the sub-agent's Read result (the marker %s) is not in the transcript", marker)
	}
	if r.final["subtype"] != "success" || r.final["is_error"] != false {
		t.Errorf("the run did not end in a successful answer: %v", r.final)
	}
	inst := sessionInstance(t, st, r.session)

	// The log: the session's children, on every edge; each has its own
	// generation binding and no context binding of its own (it routes by
	// the session's).
	var children []string
	waitfor.Reason(t, 30*time.Second, "every edge holds the sub-agent's link", func() string {
		for _, n := range edges {
			children = n.Edge().Node().State().Children(r.session)
			if len(children) == 0 {
				return n.ID + " holds no child of " + r.session
			}
		}
		return ""
	})
	for _, c := range children {
		if !strings.HasPrefix(c, r.session+"/agent/") {
			t.Errorf("child %q: want %s/agent/<id>", c, r.session)
		}
		if _, found, err := edges[0].Binding(ctx, fsm.FleetGeneration, c); err != nil || !found {
			t.Errorf("no generation binding of the sub-agent %s (%v)", c, err)
		}
		if b, found, _ := edges[0].Binding(ctx, fsm.FleetContext, c); found {
			t.Errorf("the sub-agent %s has a context binding of its own (%s): it must route by its session", c, b.Instance)
		}
	}
	// `tether audit explain` of the session (edge-1 stopped: its files
	// are the audit's to open) lists them, at depth 1, and their context
	// steps on the session's instance.
	if err := edges[0].Stop(ctx); err != nil {
		t.Fatal(err)
	}
	ex := explain(t, st, dataDir, r.session)
	t.Logf("sub-agents of %s: %q; %d sub-agent messages in the transcript", r.session, children, r.subagents)
	if len(ex.Children) != len(children) {
		t.Errorf("audit explain lists %d children of the session, the state %d", len(ex.Children), len(children))
	}
	for _, c := range ex.Children {
		if c.Depth != 1 || c.Parent != r.session {
			t.Errorf("audit explain: child %q of %q at depth %d, want a child of %s at depth 1", c.Child, c.Parent, c.Depth, r.session)
		}
		for _, h := range c.Histories {
			for _, it := range h.Items {
				if h.Fleet == "context" && it.Instance != "" && it.Instance != inst {
					t.Errorf("sub-agent %s's context step on %s, the session's instance is %s", c.Child, it.Instance, inst)
				}
			}
		}
	}
}

// explain is `tether audit explain` of key over edge-1's data directory
// (the edge stopped).
func explain(t *testing.T, st *devstack.Stack, dataDir, key string) *audit.Explanation {
	t.Helper()
	d, err := audit.Open(filepath.Join(dataDir, st.Edges()[0].ID), audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ex, err := d.Explain(context.Background(), key, audit.ExplainOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ex
}
