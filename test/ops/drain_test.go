package ops

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/ops/operator"
)

// Scale-down as an operator does it, with the binary: `tether operator
// instance drain NAME` through the edges, `instance list` shows it, the
// drained instance's conversation moves on its next turn and no new one
// lands there, `tether audit explain` on a copy of an edge's data dir says
// why the conversation moved, `instance undrain` ends it, and a name the
// log does not hold is an error.
func TestInstanceDrainCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the tether binary")
	}
	bin := tetherBin(t)
	f := startFleet(t, fleetOptions{ctxWorkers: 2, genWorkers: 1})
	f.waitReady(30*time.Second, nil)
	urls := f.urls()
	operatorCmd := func(args ...string) (string, error) {
		cmd := exec.Command(bin, append(append([]string{"operator"}, args...), "--edge", strings.Join(urls, ","))...)
		cmd.Env = append(cmd.Environ(), "TETHER_ADMIN_TOKEN="+adminToken)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	// A drain needs the cluster at feature level 3, which the leader
	// commits once every voter has announced it.
	waitFor(t, 30*time.Second, "feature level 3 committed on every edge", func() string {
		for _, s := range f.edges.Running() {
			if lvl := s.state().FeatureLevel(); lvl < fsm.FeatureLevelDrain {
				return fmt.Sprintf("%s at level %d", s.id, lvl)
			}
		}
		return ""
	})
	first, err := f.chat(0, "drain-a", "", "plan the work")
	if err != nil {
		t.Fatal(err)
	}
	home := first.contextInstance()
	out, err := operatorCmd("instance", "drain", home)
	if err != nil || !strings.Contains(out, "drained "+home+" (context)") || !strings.Contains(out, "move on their next turns") {
		t.Fatalf("instance drain %s: %v\n%s", home, err, out)
	}
	out, err = operatorCmd("instance", "list", "--json")
	var il operator.InstanceList
	if err != nil || json.Unmarshal([]byte(out), &il) != nil {
		t.Fatalf("instance list --json: %v\n%s", err, out)
	}
	listed := false
	for _, in := range il.Instances {
		if in.ID == home {
			listed = in.Drained && in.Draining && in.LogStatus == "up" && in.DrainedSince != nil
		}
	}
	if !listed {
		t.Fatalf("instance list does not show %s drained: %s", home, out)
	}
	if out, err = operatorCmd("instance", "list"); err != nil || !strings.Contains(out, "DRAINED") || !strings.Contains(out, "true (since ") {
		t.Fatalf("instance list: %v\n%s", err, out)
	}

	next, err := f.chat(1, "drain-a", "", "next step")
	if err != nil || next.contextInstance() == home || next.contextInstance() == "" {
		t.Fatalf("drain-a's next turn after the drain of %s: %+v %v", home, next, err)
	}
	for i, s := range []string{"drain-b", "drain-c", "drain-d"} {
		if tr, err := f.chat(i, s, "", "plan the work"); err != nil || tr.contextInstance() == home {
			t.Fatalf("%s placed on the drained %s: %+v %v", s, home, tr, err)
		}
	}

	f.quiesce()
	dir := filepath.Join(t.TempDir(), "copy")
	copyDir(t, f.edges.Member(0).DataDir, dir)
	expl, err := exec.Command(bin, "audit", "explain", "--data-dir", dir, "--key", "drain-a", "--fleet", "context").CombinedOutput()
	t.Logf("explain drain-a:\n%s", expl)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"overflow " + home + " -> " + next.contextInstance() + " (drained, rebind=true)", "an operator drained " + home,
		"evidence: rule overflow:drained;", "[bound,draining]"} {
		if !strings.Contains(string(expl), want) {
			t.Errorf("explain drain-a lacks %q", want)
		}
	}

	if out, err = operatorCmd("instance", "undrain", home); err != nil || !strings.Contains(out, "undrained "+home) {
		t.Fatalf("instance undrain %s: %v\n%s", home, err, out)
	}
	out, err = operatorCmd("instance", "drain", "nosuch-instance")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(out, "instance_not_found") || !strings.Contains(out, `"nosuch-instance"`) {
		t.Fatalf("drain of an unknown instance: want exit 1 naming it, got %v\n%s", err, out)
	}
}
