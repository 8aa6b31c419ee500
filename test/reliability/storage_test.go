package reliability

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
)

// singleNode opens a one-voter cluster in dir (bootstrapping it on first use).
func singleNode(t *testing.T, dir string) (*cluster.Node, cluster.Config, error) {
	t.Helper()
	cfg := cluster.Config{
		Settings: cluster.Settings{NodeID: "solo", DataDir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true, ProposeTimeout: 5 * time.Second, Raft: timing},
		AuthKey:  authKey,
		Logger:   logger(),
	}
	// Bootstrap needs the node's own address before it listens: take a
	// port, then hand the listener over.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener = ln
	cfg.BindAddr = ln.Addr().String()
	cfg.Peers = []cluster.Peer{{ID: "solo", Addr: cfg.BindAddr}}
	n, err := cluster.Open(context.Background(), cfg)
	return n, cfg, err
}

// populate opens a node in dir, commits binds and closes it cleanly.
func populate(t *testing.T, dir string, binds int) {
	t.Helper()
	n, _, err := singleNode(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the single node to lead", n.IsLeader)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range binds {
		if _, err := n.Propose(ctx, fsm.Bind{Fleet: fsm.FleetContext, Key: fmt.Sprintf("k%d", i), Instance: "w1"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// damage rewrites a file: fn gets its bytes and returns the new content.
func damage(t *testing.T, path string, fn func([]byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, fn(b), 0o600); err != nil {
		t.Fatal(err)
	}
}

// openMustRefuse opens the damaged data dir: it must fail with an error
// naming the damaged file, without a panic, and leave nothing running.
func openMustRefuse(t *testing.T, dir, wantInErr string) {
	t.Helper()
	var (
		n   *cluster.Node
		err error
	)
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Open panicked on a damaged data dir: %v", r)
			}
		}()
		n, _, err = singleNode(t, dir)
	}()
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n.Close(ctx)
		t.Fatalf("Open accepted a damaged data dir (%s)", wantInErr)
	}
	if !strings.Contains(err.Error(), wantInErr) {
		t.Fatalf("Open error %q does not name %q", err, wantInErr)
	}
	t.Logf("refused as expected: %v", err)
}

func TestDamagedStorageRefusesToStart(t *testing.T) {
	garbage := func(b []byte) []byte { return []byte(strings.Repeat("not a bolt file ", 512)) }
	truncate := func(b []byte) []byte { return b[:len(b)/3] }
	empty := func([]byte) []byte { return nil }
	zeroMeta := func(b []byte) []byte {
		// Zero both meta pages (the first 2 pages of 4 KiB): bbolt's
		// checksums catch it.
		out := append([]byte(nil), b...)
		for i := 0; i < min(len(out), 8192); i++ {
			out[i] = 0
		}
		return out
	}
	cases := []struct {
		name, file string
		fn         func([]byte) []byte
		want       string
	}{
		{"raft.db garbage", "raft.db", garbage, "raft.db"},
		{"raft.db truncated", "raft.db", truncate, "raft.db"},
		{"raft.db meta pages zeroed", "raft.db", zeroMeta, "raft.db"},
		{"archive.db garbage", "archive.db", garbage, "archive.db"},
		{"archive.db truncated", "archive.db", truncate, "archive.db"},
		{"archive.db meta pages zeroed", "archive.db", zeroMeta, "archive.db"},
		{"raft.db empty", "raft.db", empty, "raft.db holds no Raft state"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			populate(t, dir, 50)
			damage(t, filepath.Join(dir, c.file), c.fn)
			openMustRefuse(t, dir, c.want)
		})
	}
}

// A damaged snapshot must not be silently restored as a wrong state.
func TestDamagedSnapshotIsNotRestoredSilently(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	n, _, err := singleNode(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the single node to lead", n.IsLeader)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 40 {
		if _, err := n.Propose(ctx, fsm.Bind{Fleet: fsm.FleetContext, Key: fmt.Sprintf("k%d", i), Instance: "w1"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	want := n.Status()
	if err := n.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var snaps []string
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "state.bin" {
			snaps = append(snaps, path)
		}
		return nil
	})
	if len(snaps) == 0 {
		t.Fatal("no snapshot file written")
	}
	for _, s := range snaps {
		damage(t, s, func(b []byte) []byte {
			out := append([]byte(nil), b...)
			out[len(out)/2] ^= 0xff
			return out
		})
	}
	var n2 *cluster.Node
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Open panicked on a damaged snapshot: %v", r)
			}
		}()
		n2, _, err = singleNode(t, dir)
	}()
	if err != nil {
		t.Logf("refused as expected: %v", err)
		return
	}
	defer n2.Close(ctx)
	// If it started, it must have recovered the exact state from the log
	// (raft keeps trailing logs), or halted: never a different state.
	waitFor(t, 10*time.Second, "the restarted node to apply", func() bool {
		return n2.Status().StateIndex >= want.StateIndex || n2.FatalError() != nil
	})
	if err := n2.FatalError(); err != nil {
		t.Logf("halted as expected: %v", err)
		return
	}
	if got := n2.Status(); got.StateIndex == want.StateIndex && got.StateHash != want.StateHash {
		t.Fatalf("restarted from a damaged snapshot with a different state: hash %s, want %s", got.StateHash, want.StateHash)
	}
}

// The archive refuses what it cannot read, with the path in the error.
func TestArchiveOpenErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := archive.Open(filepath.Join(dir, "missing.db"), archive.Options{ReadOnly: true}); err == nil || !strings.Contains(err.Error(), "missing.db") {
		t.Fatalf("read-only open of a missing archive: %v", err)
	}
	p := filepath.Join(dir, "bad.db")
	if err := os.WriteFile(p, []byte("garbage garbage garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := archive.Open(p, archive.Options{}); err == nil || !strings.Contains(err.Error(), "bad.db") {
		t.Fatalf("open of a garbage archive: %v", err)
	}
	// A data dir path that is a file, not a directory.
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := singleNode(t, notDir); err == nil || !strings.Contains(err.Error(), notDir) {
		t.Fatalf("Open with DataDir a regular file: %v", err)
	}
}
