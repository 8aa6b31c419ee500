package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// README's "Claude Code, Codex and the Agents SDK through tether" shows
// curl commands; they run as written against `tether dev` (its edges'
// addresses in place of localhost:8000..8002) and answer what the comments
// after them say, on the default split fleets and on the aggregated fleet
// (--generation-workers 0).
func TestReadmeAgentAPIs(t *testing.T) {
	t.Run("disaggregated", func(t *testing.T) { readmeAgentAPIs(t) })
	t.Run("aggregated", func(t *testing.T) { readmeAgentAPIs(t, "--generation-workers", "0") })
}

func readmeAgentAPIs(t *testing.T, args ...string) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(raw), "<!-- readme-agent-apis -->\n```sh\n")
	if !ok {
		t.Fatal("README.md has no readme-agent-apis block")
	}
	script, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("the readme-agent-apis block does not end")
	}
	p := startDev(t, args...)
	for i := 0; i < 3; i++ {
		script = strings.ReplaceAll(script, "https://localhost:800"+string(rune('0'+i)), p.edge(i))
	}
	var expect []string
	for _, line := range strings.Split(script, "\n") {
		if c, ok := strings.CutPrefix(strings.TrimSpace(line), "# {"); ok {
			expect = append(expect, "{"+c)
		}
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Env = append(os.Environ(), "CA="+p.caFile)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's commands failed: %v\n%s", err, out)
	}
	answers := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(answers) != len(expect) {
		t.Fatalf("%d answers for %d documented ones:\n%s", len(answers), len(expect), out)
	}
	for i, want := range expect {
		// Each documented answer is a sketch: every "key":value it shows
		// (a string value up to its "…") is in the real one.
		for _, m := range pairRE.FindAllStringSubmatch(want, -1) {
			frag := m[0]
			if strings.HasPrefix(m[2], `"`) && !strings.HasSuffix(m[2], `"`) {
				frag = `"` + m[1] + `":` + m[2] // a truncated string: its prefix
			}
			if !strings.Contains(answers[i], frag) {
				t.Errorf("answer %d lacks %s:\n%s", i+1, frag, answers[i])
			}
		}
	}
}

// pairRE is a "key":value of a documented answer: a string (possibly cut
// by "…") or a bare value.
var pairRE = regexp.MustCompile(`"([a-z_]+)":("[^"…]*"?|[a-z0-9_-]+)`)
