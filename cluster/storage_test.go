package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// damagedNode builds a single node with some history (a snapshot
// included), closes it, applies damage to its data dir and opens it again.
func damagedNode(t *testing.T, damage func(dir string)) error {
	t.Helper()
	tc := newTestCluster(t, 1, func(i int, c *Config) { c.TrailingLogs = 5 })
	n := tc.node(0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 30 {
		if _, err := n.Propose(ctx, bindEv(fmt.Sprintf("k%d", i), "w1")); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.WaitArchived(ctx, n.State().Index()); err != nil {
		t.Fatal(err)
	}
	tc.stop(0, false)
	cfg := tc.cfgs[0]
	damage(cfg.DataDir)
	open := func() error {
		c := cfg
		c.Listener, c.BindAddr = nil, "127.0.0.1:0"
		var (
			reopened *Node
			err      error
		)
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("Open panicked on a damaged data dir: %v", r)
				}
			}()
			reopened, err = Open(ctx, c)
		}()
		if err == nil {
			reopened.Close(ctx)
		}
		return err
	}
	err := open()
	// The refusal must not leave the files locked: a second attempt gives
	// the same answer, not "locked by another node".
	if err != nil {
		if again := open(); again == nil || again.Error() != err.Error() {
			t.Fatalf("second open: %v, first: %v", again, err)
		}
	}
	return err
}

func rewrite(t *testing.T, path string, fn func([]byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, fn(b), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A truncated raft.db must not make bbolt panic inside Open.
func TestTruncatedRaftDBRefusesToStart(t *testing.T) {
	t.Parallel()
	err := damagedNode(t, func(dir string) {
		rewrite(t, filepath.Join(dir, raftDBFile), func(b []byte) []byte { return b[:len(b)/3] })
	})
	if err == nil || !strings.Contains(err.Error(), raftDBFile) || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("Open of a truncated raft.db: %v, want an error naming the damaged file", err)
	}
	t.Logf("refused: %v", err)
}

// An emptied raft.db would count as "no Raft state", and Bootstrap would
// re-create the cluster beside the old archive. It is refused, with what was found and
// how to recover; so is a raft.db lost beside snapshots only.
func TestEmptiedRaftDBRefusesToStart(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		extra func(dir string)
		want  []string
	}{
		{"beside the archive and snapshots", func(string) {}, []string{archiveFile + " holds entries up to index", "holds a snapshot at index"}},
		{"beside snapshots only", func(dir string) { os.Remove(filepath.Join(dir, archiveFile)) }, []string{"holds a snapshot at index"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := damagedNode(t, func(dir string) {
				if err := os.WriteFile(filepath.Join(dir, raftDBFile), nil, 0o600); err != nil {
					t.Fatal(err)
				}
				c.extra(dir)
			})
			if err == nil {
				t.Fatal("Open started a node whose raft.db was emptied")
			}
			for _, want := range append(c.want, raftDBFile+" holds no Raft state", "wipe the data dir", "re-join", "restore raft.db") {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
		})
	}
}
