package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tether-project/tether/ops/devstack"
)

// TestRestartKeepsBindings: `tether dev --data-dir X`, stopped with SIGTERM
// and started again on X (new HTTP and worker ports; the admin token, kept
// in X, printed again),
// still binds the conversations to the same instances, and a further turn
// goes there.
func TestRestartKeepsBindings(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev-data")
	model := devstack.DefaultModel

	p := startDev(t, "--data-dir", dir)
	// The restarted stack reuses the data dir's CA: one client for both.
	c := p.client(t)
	if p.dataDir != dir {
		t.Fatalf("printed data dir %q, want %q", p.dataDir, dir)
	}
	parent := &agent{session: "parent-1", system: words("lead", 200)}
	child := &agent{session: "child-a", parent: "parent-1", system: words("explore", 200)}
	p1 := parent.mustSend(t, c, p.edge(0), model, "hello")
	a1 := child.mustSend(t, c, p.edge(1), model, "look around")
	p.stopWith(t, syscall.SIGTERM) // as a process manager would stop it
	if _, err := os.Stat(filepath.Join(dir, "edge-1", "raft.db")); err != nil {
		t.Fatalf("data dir not kept: %v", err)
	}

	p2 := startDev(t, "--data-dir", dir)
	if p2.token != p.token {
		t.Fatalf("admin token %q after restart, was %q (it is kept in the data dir)", p2.token, p.token)
	}
	for i := range 3 {
		b, ok := adminBinding(t, c, p2.edge(i), p2.token, "context", "parent-1")
		if !ok || b.Instance != p1.ctxInst || b.ConversationID != "parent-1" {
			t.Fatalf("after restart, edge-%d: context binding of parent-1 = %+v (found %v), want %s", i+1, b, ok, p1.ctxInst)
		}
		g, ok := adminBinding(t, c, p2.edge(i), p2.token, "generation", "child-a")
		if !ok || g.Instance != a1.genInst {
			t.Fatalf("after restart, edge-%d: generation binding of child-a = %+v (found %v), want %s", i+1, g, ok, a1.genInst)
		}
	}
	p2turn := parent.mustSend(t, c, p2.edge(2), model, "and now?")
	a2 := child.mustSend(t, c, p2.edge(0), model, "more")
	if p2turn.ctxInst != p1.ctxInst || a2.ctxInst != p1.ctxInst || a2.genInst != a1.genInst {
		t.Fatalf("after restart: parent on %s (was %s), child-a on %s/%s (was %s/%s)",
			p2turn.ctxInst, p1.ctxInst, a2.ctxInst, a2.genInst, a1.ctxInst, a1.genInst)
	}
	p2.stop(t)
}

// Bad flags exit with status 2 and a message naming the flag, before
// anything starts.
func TestDevRejectsBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--scope", "sideways"}, "subagent_affinity_scope: unknown value \"sideways\""},
		{[]string{"--edges", "0"}, "--edges must be at least 1"},
		{[]string{"--ranks", "-1"}, "--ranks must be at least 1"},
		{[]string{"--generation-workers", "-1"}, "--generation-workers must be 0 (an aggregated fleet) or more"},
		{[]string{"--generation-workers", "0", "--scope", "both"}, "scope: both makes sub-agents follow their parent on the generation fleet too"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"--no-such-flag"}, "no-such-flag"},
		{[]string{"--port", "65534"}, "port: edges need ports 65534..65536"},
		{[]string{"--admin-token", "short"}, "admin token: 5 bytes is too short"},
		{[]string{"extra"}, "unexpected argument \"extra\""},
	} {
		out, err := exec.Command(tetherBin(t), append([]string{"dev"}, c.args...)...).CombinedOutput()
		var ee *exec.ExitError
		if !errorsAs(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("tether dev %v: %v, want exit status 2\n%s", c.args, err, out)
		}
		if !strings.Contains(string(out), c.want) {
			t.Fatalf("tether dev %v: output does not mention %q:\n%s", c.args, c.want, out)
		}
	}
}
