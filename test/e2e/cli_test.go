package e2e

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
)

// `tether version` and `tether --version` say what the build is: version,
// commit, event schema and feature levels (before: "tether dev" only, and
// --version was an unknown command).
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, err := exec.Command(tetherBin(t), args...).CombinedOutput()
		if err != nil {
			t.Fatalf("tether %v: %v\n%s", args, err, out)
		}
		for _, want := range []string{"tether ", "commit:", "event schema:", "feature levels:", "telemetry level:"} {
			if !strings.Contains(string(out), want) {
				t.Fatalf("tether %v lacks %q:\n%s", args, want, out)
			}
		}
	}
}

// --help at every level exits 0 (before, `tether operator raft --help` was a
// usage error with exit 2) and prints the usage on standard output, where
// `tether … --help | less` finds it (before: standard error).
func TestHelpAtEveryLevelExitsZero(t *testing.T) {
	for _, args := range []string{
		"--help", "help", "version --help", "dev --help", "edge --help", "worker --help", "bench --help",
		"audit --help", "audit replay --help", "audit verify --help", "audit explain --help", "audit export --help",
		"operator --help", "operator help", "operator raft --help", "operator snapshot --help", "operator raft help",
		"operator raft list-peers --help", "operator raft add-voter --help", "operator snapshot save --help",
	} {
		cmd := exec.Command(tetherBin(t), strings.Fields(args)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("tether %s: %v\n%s%s", args, err, out, stderr.String())
		}
		if !strings.Contains(strings.ToLower(string(out)), "usage") || stderr.Len() > 0 {
			t.Fatalf("tether %s: want the usage on stdout and nothing on stderr; stdout:\n%s\nstderr:\n%s", args, out, stderr.String())
		}
	}
	// A mistake still goes to stderr, with exit 2.
	cmd := exec.Command(tetherBin(t), "dev", "--no-such-flag")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || len(out) > 0 || !strings.Contains(stderr.String(), "no-such-flag") {
		t.Fatalf("tether dev --no-such-flag: want exit 2 and the error on stderr only: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
}

// `tether bench agents -h` lists only flags bench agents accepts (before:
// it listed --edge-urls, --model and --parent-header and then refused
// --edge-urls); bench replay, which takes them, still lists them.
func TestBenchAgentsHelpListsOnlyItsFlags(t *testing.T) {
	for _, c := range []struct {
		cmd  string
		want bool
	}{{"agents", false}, {"replay", true}} {
		out, err := exec.Command(tetherBin(t), "bench", c.cmd, "-h").Output()
		if err != nil {
			t.Fatalf("bench %s -h: %v", c.cmd, err)
		}
		for _, flag := range []string{"-edge-urls", "-model", "-parent-header"} {
			if got := strings.Contains(string(out), "  "+flag+" "); got != c.want {
				t.Errorf("bench %s -h lists %s: %v, want %v\n%s", c.cmd, flag, got, c.want, out)
			}
		}
	}
	out, err := exec.Command(tetherBin(t), "bench", "agents", "--pattern", "react", "--edge-urls", "http://127.0.0.1:1").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "flag provided but not defined: -edge-urls") {
		t.Fatalf("bench agents --edge-urls: want the flag refused as unknown (exit 2), got %v\n%s", err, out)
	}
}

// An operator call to an HTTPS edge whose CA the client does not trust says
// so once and names the fix (before: "operator: no edge reachable:
// operator: … x509: certificate signed by unknown authority").
func TestOperatorUnknownCAErrorNamesTheFix(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	out, err := exec.Command(tetherBin(t), "operator", "raft", "list-peers", "--edge", srv.URL, "--admin-token", "token-0123456789abcdef").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("want exit 1, got %v:\n%s", err, out)
	}
	msg := string(out)
	if strings.Count(msg, "operator:") != 1 || !strings.Contains(msg, "pass --cacert <ca.pem>") || !strings.Contains(msg, "x509") {
		t.Fatalf("error repeats its prefix or lacks the fix:\n%s", msg)
	}
}
