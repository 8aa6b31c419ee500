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
// usage error with exit 2).
func TestHelpAtEveryLevelExitsZero(t *testing.T) {
	for _, args := range []string{
		"--help", "help", "version --help", "dev --help", "edge --help", "worker --help", "bench --help",
		"audit --help", "audit replay --help", "audit verify --help", "audit explain --help", "audit export --help",
		"operator --help", "operator help", "operator raft --help", "operator snapshot --help", "operator raft help",
		"operator raft list-peers --help", "operator raft add-voter --help", "operator snapshot save --help",
	} {
		cmd := exec.Command(tetherBin(t), strings.Fields(args)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("tether %s: %v\n%s", args, err, out)
		}
		if !strings.Contains(strings.ToLower(string(out)), "usage") {
			t.Fatalf("tether %s printed no usage:\n%s", args, out)
		}
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
