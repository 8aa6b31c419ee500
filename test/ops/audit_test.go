package ops

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/ops/audit"
)

// agentWorkload runs parents with two sub-agents each, through different
// edges, and checks each sub-agent shares its parent's context instance.
// A sub-agent starts once every edge's replica holds its parent's binding:
// a sub-agent reaching an edge that has neither applied nor heard its
// parent's placement is placed by that edge's own decision (a race the
// product allows and the log settles), which is not what this workload
// checks.
func agentWorkload(t *testing.T, f *fleet, parents, rounds int) {
	t.Helper()
	for r := range rounds {
		for p := range parents {
			parent := fmt.Sprintf("parent-%d", p)
			pt, err := f.chat(p, parent, "", fmt.Sprintf("round %d: plan the work", r))
			if err != nil {
				t.Fatal(err)
			}
			f.waitBound(fsm.FleetContext, parent, 20*time.Second)
			for c, child := range []string{parent + "-child-a", parent + "-child-b"} {
				ct, err := f.chat(p+c+1, child, parent, fmt.Sprintf("round %d: sub-task %d", r, c))
				if err != nil {
					t.Fatal(err)
				}
				if ct.contextInstance() != pt.contextInstance() {
					t.Fatalf("%s landed on %s, its parent %s on %s", child, ct.route, parent, pt.route)
				}
			}
		}
	}
}

// The audit scenario on a live 3-edge cluster: copy a data dir,
// replay reproduces the live state hash, verify passes, explain shows a
// parent with both sub-agents and their decisions; one corrupted event in
// the copy makes verify fail.
func TestAuditCopyOfALiveEdge(t *testing.T) {
	f := startFleet(t, fleetOptions{})
	f.waitReady(30*time.Second, nil)
	agentWorkload(t, f, 4, 2)
	idx := f.quiesce()

	src := f.edges.Node(1) // a copy of any edge works; take a follower's or the leader's
	copyDst := filepath.Join(t.TempDir(), "edge-copy")
	copyDir(t, src.dataDir, copyDst)

	// The live directory is locked by the running node.
	if _, err := audit.Open(src.dataDir, audit.Options{LockTimeout: 100 * time.Millisecond}); !errors.Is(err, audit.ErrLocked) ||
		!strings.Contains(err.Error(), "copy the data directory first") {
		t.Fatalf("opening the live data dir: %v, want ErrLocked telling to copy it", err)
	}

	d, err := audit.Open(copyDst, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := d.Replay(context.Background(), audit.ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Index != idx {
		t.Fatalf("replay reached index %d, the cluster is at %d", res.Index, idx)
	}
	for _, s := range f.edges.Running() {
		st := s.state()
		if h := st.Hash(); st.Index() != idx || h != res.Hash {
			t.Fatalf("%s at index %d has hash %x; the replay of %s's copy gives %x", s.id, st.Index(), h, src.id, res.Hash)
		}
	}
	if res.MismatchCount != 0 || res.Start.Snapshot != nil {
		t.Fatalf("replay: %d outcome mismatches %v, start %s", res.MismatchCount, res.Mismatches, res.Start)
	}
	sum := audit.Summarize(res.State)
	if sum.PerFleet["context"] != 4 || sum.PerFleet["generation"] != 12 || sum.Links != 8 {
		t.Errorf("summary: per fleet %v, %d links; want 4 context (one per parent), 12 generation (scope context), 8 links", sum.PerFleet, sum.Links)
	}

	rep, err := audit.Verify(context.Background(), d, f.operatorClient(src), audit.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Mode != "hash" || rep.Index != idx {
		t.Fatalf("verify: %+v", rep)
	}

	ex, err := d.Explain(context.Background(), "parent-1", audit.ExplainOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkParentExplanation(t, ex, "parent-1")
	d.Close()

	// Corrupt one archived event in the copy: a Bind now names another
	// instance. Replay still runs; verify must fail and say where.
	corruptOneBind(t, filepath.Join(copyDst, audit.ArchiveFile))
	d, err = audit.Open(copyDst, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	rep, err = audit.Verify(context.Background(), d, f.operatorClient(src), audit.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || !strings.HasPrefix(rep.Message, fmt.Sprintf("MISMATCH at index %d", idx)) || !strings.Contains(rep.Message, rep.LiveHash) ||
		!strings.Contains(rep.Message, rep.ReplayHash) {
		t.Fatalf("verify after corruption: %+v", rep)
	}
}

func checkParentExplanation(t *testing.T, ex *audit.Explanation, parent string) {
	t.Helper()
	var text bytes.Buffer
	_ = ex.WriteText(&text)
	ctxHist := ex.Histories[0]
	if ctxHist.Fleet != "context" || len(ctxHist.Items) == 0 || ctxHist.Items[0].Kind != "bind" {
		t.Fatalf("context history of %s:\n%s", parent, text.String())
	}
	bind := ctxHist.Items[0]
	if bind.Decision == nil || !strings.HasPrefix(bind.Decision.Edge, "edge-") || bind.Decision.Policy == "" ||
		len(bind.Decision.Candidates) == 0 || !strings.HasPrefix(bind.Outcome, "bound to ctx-") {
		t.Fatalf("the parent's bind lacks its decision:\n%s", text.String())
	}
	touches := 0
	for _, it := range ctxHist.Items {
		if it.Kind == "touches" {
			touches += it.Count
		}
	}
	if touches == 0 {
		t.Errorf("no touch window in the parent's history (its sub-agents and second round used it):\n%s", text.String())
	}
	if len(ex.Children) != 2 {
		t.Fatalf("children of %s: %d, want 2:\n%s", parent, len(ex.Children), text.String())
	}
	// Children in the order their links committed: the two sub-agents'
	// links are recorded in the background, by the edges that served them.
	children := map[string]audit.Child{}
	for _, c := range ex.Children {
		children[c.Child] = c
	}
	for _, want := range []string{parent + "-child-a", parent + "-child-b"} {
		c := children[want]
		if c.Child != want || c.Parent != parent || c.Status != "applied" {
			t.Errorf("child %s: %+v", want, c)
		}
		var gen *audit.KeyHistory
		for j := range c.Histories {
			if c.Histories[j].Fleet == "generation" {
				gen = &c.Histories[j]
			}
		}
		if gen == nil || len(gen.Items) == 0 || gen.Items[0].Kind != "bind" || gen.Items[0].Decision == nil || gen.Items[0].Instance == "" {
			t.Errorf("child %s: no generation bind with its decision:\n%s", want, text.String())
		}
	}
	for _, want := range []string{fmt.Sprintf("key %q", parent), "decided by edge edge-", `child "` + parent + `-child-a"`, `child "` + parent + `-child-b"`} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("explain text lacks %q:\n%s", want, text.String())
		}
	}
}

// corruptOneBind rewrites the first archived record holding a Bind to
// ctx-1 so that it names ctx-9 instead (same length: the record still
// decodes). It edits the bbolt file directly, as damage or tampering would.
func corruptOneBind(t *testing.T, path string) {
	t.Helper()
	a, err := archive.Open(path, archive.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var target uint64
	errFound := errors.New("found")
	err = a.Range(0, 0, func(r archive.Record) error {
		ps, err := r.Proposals()
		if err != nil {
			return err
		}
		for _, p := range ps {
			if b, ok := p.Event.(fsm.Bind); ok && b.Instance == "ctx-1" {
				target = r.Index
				return errFound
			}
		}
		return nil
	})
	a.Close()
	if !errors.Is(err, errFound) {
		t.Fatalf("no Bind to ctx-1 in the archive: %v", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("records"))
		k := binary.BigEndian.AppendUint64(nil, target)
		v := b.Get(k)
		if v == nil {
			return fmt.Errorf("record %d not found", target)
		}
		return b.Put(k, bytes.ReplaceAll(v, []byte("ctx-1"), []byte("ctx-9")))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("corrupted the Bind(s) of archived entry %d", target)
}

// The CLI end to end: `tether audit verify` exits 0 on the copy and 1 with
// the mismatch message after the corruption; `replay` prints the hash.
func TestAuditCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the tether binary")
	}
	bin := tetherBin(t)
	f := startFleet(t, fleetOptions{edges: 1, ctxWorkers: 1})
	f.waitReady(30*time.Second, nil)
	agentWorkload(t, f, 2, 1)
	f.quiesce()
	dir := filepath.Join(t.TempDir(), "copy")
	e := f.edges.Node(0)
	copyDir(t, e.dataDir, dir)
	live := e.state()
	h := live.Hash()

	out, err := exec.Command(bin, "audit", "replay", "--data-dir", dir).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "state hash:     "+hex.EncodeToString(h[:])) {
		t.Fatalf("audit replay: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "audit", "verify", "--data-dir", dir, "--edge", e.url())
	cmd.Env = append(cmd.Environ(), "TETHER_ADMIN_TOKEN="+adminToken)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "OK: state hash at index") {
		t.Fatalf("audit verify: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "audit", "explain", "--data-dir", dir, "--key", "parent-0").CombinedOutput()
	t.Logf("explain:\n%s", out)
	if err != nil || !strings.Contains(string(out), `child "parent-0-child-b"`) {
		t.Fatalf("audit explain: %v\n%s", err, out)
	}
	// A key the log knows nothing about is an error (exit 1), in text and
	// JSON alike, so a script cannot take a typo for an idle key.
	for _, extra := range [][]string{nil, {"--json"}} {
		args := append([]string{"audit", "explain", "--data-dir", dir, "--key", "nosuchkey"}, extra...)
		out, err := exec.Command(bin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), `key "nosuchkey": nothing in this data directory's log`) {
			t.Fatalf("audit explain of an unknown key %v: want exit 1 naming the key, got %v\n%s", extra, err, out)
		}
	}
	out, err = exec.Command(bin, "audit", "export", "--data-dir", dir, "--format", "ndjson").Output()
	if err != nil || bytes.Count(out, []byte("\n")) < 10 || !bytes.Contains(out, []byte(`"type":"Bind"`)) {
		t.Fatalf("audit export: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "audit", "replay", "--data-dir", e.dataDir, "--lock-timeout", "100ms").CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "copy the data directory first") {
		t.Fatalf("audit replay on the live dir: %v\n%s", err, out)
	}

	corruptOneBind(t, filepath.Join(dir, audit.ArchiveFile))
	cmd = exec.Command(bin, "audit", "verify", "--data-dir", dir, "--edge", e.url(), "--admin-token", adminToken)
	out, err = cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "MISMATCH at index") {
		t.Fatalf("audit verify after corruption: %v\n%s", err, out)
	}
}

// A sticky turn's touch waits in its edge's batch until the next
// touch_interval: the edge counts it as background work still owed to the
// log, so quiesce does not take the index before the Touch is in it.
func TestQuiesceWaitsForTheTouchBatch(t *testing.T) {
	f := startFleet(t, fleetOptions{edges: 1, edgeConfig: func(_ int, _ string, c *edge.Config) {
		c.TouchInterval = time.Hour // the batch flushes when the edge closes
	}})
	f.waitReady(30*time.Second, nil)
	if _, err := f.chat(0, "touched", "", "first turn"); err != nil {
		t.Fatal(err)
	}
	f.waitBound(fsm.FleetContext, "touched", 20*time.Second)
	e := f.edges.Node(0)
	waitFor(t, 20*time.Second, "the first turn's background work recorded", func() string {
		if n := e.BackgroundPending(); n > 0 {
			return fmt.Sprintf("%d pending", n)
		}
		return ""
	})
	if _, err := f.chat(0, "touched", "", "second turn"); err != nil {
		t.Fatal(err)
	}
	b, ok := e.state().Lookup(fsm.FleetContext, "touched")
	if !ok || b.LastUsed != b.BoundAt {
		t.Fatalf("binding %+v (%v): want it bound and not touched yet", b, ok)
	}
	if n := e.BackgroundPending(); n == 0 {
		t.Fatal("the sticky turn's touch is waiting in the batch, yet the edge owes the log nothing")
	}
}
