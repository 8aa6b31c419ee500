package e2e

import (
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The example `tether dev` prints runs as printed (bash and curl) and shows
// what it says: the sub-agent lands on the parent's context instance and
// reports cached tokens. With one edge it does not talk of "another edge"
// or "1 edges". Before, its prompt was too short for a whole 64-token block
// (cached_tokens 0) and it read "starting 1 edges"; every start warned about
// raft's first election. The same for the aggregated fleet
// (--generation-workers 0), whose answers come from one hop.
func TestDevBannerExampleShowsACacheHit(t *testing.T) {
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: the banner's example is a shell script with curl", tool)
		}
	}
	t.Run("disaggregated", func(t *testing.T) { bannerShowsACacheHit(t, false) })
	t.Run("aggregated", func(t *testing.T) { bannerShowsACacheHit(t, true) })
}

func bannerShowsACacheHit(t *testing.T, aggregated bool) {
	args := []string{"--edges", "1"}
	if aggregated {
		args = append(args, "--generation-workers", "0")
	}
	p := startDev(t, args...)
	// A healthy start is quiet at the default log level (before: a WARN
	// about raft's first election every time).
	if e := p.stderr.String(); strings.Contains(e, "level=WARN") || strings.Contains(e, "level=ERROR") {
		t.Fatalf("warnings on a healthy start:\n%s", e)
	}
	out := p.output()
	if strings.Contains(out, "1 edges") || strings.Contains(out, "another edge") {
		t.Fatalf("banner does not read right with one edge:\n%s", out)
	}
	var script []string
	in := false
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "  CA=") || strings.HasPrefix(line, "  TOKEN="):
			in = true
		case strings.HasPrefix(line, "tether dev: ready"):
			in = false
		}
		if in {
			script = append(script, line)
		}
	}
	if len(script) == 0 {
		t.Fatalf("no example in the banner:\n%s", out)
	}
	res, err := exec.Command("bash", "-e", "-c", strings.Join(script, "\n")).CombinedOutput()
	if err != nil {
		t.Fatalf("the example failed: %v\nscript:\n%s\noutput:\n%s", err, strings.Join(script, "\n"), res)
	}
	routes := regexp.MustCompile(`(?i)x-tether-route: context=([a-z0-9-]+)/[0-9]+; generation=(-|[a-z0-9-]+/)`).FindAllStringSubmatch(string(res), -1)
	cached := regexp.MustCompile(`"prompt_tokens_details":\{"cached_tokens":(\d+)`).FindAllStringSubmatch(string(res), -1)
	if len(routes) != 2 || len(cached) != 2 {
		t.Fatalf("want two answers with routes and usage:\n%s", res)
	}
	if routes[0][1] != routes[1][1] {
		t.Fatalf("sub-agent on %s, parent on %s:\n%s", routes[1][1], routes[0][1], res)
	}
	for _, r := range routes {
		if oneHop := r[2] == "-"; oneHop != aggregated {
			t.Fatalf("route %q in a stack with aggregated %v:\n%s", r[0], aggregated, res)
		}
	}
	if n, _ := strconv.Atoi(cached[1][1]); n < 256 {
		t.Fatalf("sub-agent cached_tokens %d, want the prompt's whole blocks (256):\n%s", n, res)
	}
	// The example's last command reads the binding its first request
	// placed, which commits beside that request: on a busy host it may not
	// have yet; the example run again (the same conversation, sticky) finds it.
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(string(res), `"instance":"`+routes[0][1]+`"`) {
		if time.Now().After(deadline) {
			t.Fatalf("the admin binding does not name %s:\n%s", routes[0][1], res)
		}
		if res, err = exec.Command("bash", "-e", "-c", strings.Join(script, "\n")).CombinedOutput(); err != nil {
			t.Fatalf("the example failed again: %v\n%s", err, res)
		}
	}
}
