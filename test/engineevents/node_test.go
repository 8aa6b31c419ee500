package engineevents

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/test/crosscheck"
	"github.com/tether-project/tether/test/natstest"
	"github.com/tether-project/tether/test/npmenv"
)

// nodePublisherDir installs testdata/node-publisher's npm dependencies
// (package-lock.json, no install scripts: zeromq ships prebuilt binaries)
// into a cache directory keyed by the lock file; when node or npm is
// missing or the install fails, the test is skipped (fails in CI:
// test/crosscheck).
func nodePublisherDir(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir, err := npmenv.Install(ctx, filepath.Join("testdata", "node-publisher"), "node-publisher", "package.json", "package-lock.json", "publish.mjs")
	if err != nil {
		crosscheck.Unavailable(t, "the independent node publisher cannot run: %v", err)
	}
	// zeromq ships prebuilt native binaries; one that cannot load here
	// (another libc, say) makes the publisher unusable, not tether wrong.
	check := exec.CommandContext(ctx, "node", "--input-type=module", "-e", `await import("zeromq"); await import("@msgpack/msgpack");`)
	check.Dir = dir
	if out, err := check.CombinedOutput(); err != nil {
		crosscheck.Unavailable(t, "the node publisher's packages do not load on this machine (%v):\n%s", err, tail(string(out), 2000))
	}
	return dir
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// nodePublisher is a running publish.mjs.
type nodePublisher struct {
	t        *testing.T
	stdin    io.WriteCloser
	endpoint string
	replay   string
}

func startNodePublisher(t *testing.T, dir, layout string) *nodePublisher {
	t.Helper()
	cmd := exec.Command("node", "publish.mjs", layout)
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			first <- sc.Text()
		}
		close(first)
		io.Copy(io.Discard, stdout)
	}()
	var line string
	select {
	case line = <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("the node publisher did not print its endpoints")
	}
	var eps struct{ Endpoint, Replay string }
	if err := json.Unmarshal([]byte(line), &eps); err != nil || !strings.HasPrefix(eps.Endpoint, "tcp://") {
		t.Fatalf("node publisher's first line %q: %v", line, err)
	}
	return &nodePublisher{t: t, stdin: stdin, endpoint: eps.Endpoint, replay: eps.Replay}
}

func (p *nodePublisher) send(cmd map[string]any) {
	p.t.Helper()
	data, err := json.Marshal(cmd)
	if err != nil {
		p.t.Fatal(err)
	}
	if _, err := fmt.Fprintf(p.stdin, "%s\n", data); err != nil {
		p.t.Fatalf("write to the node publisher: %v", err)
	}
}

// An independent publisher (node, npm zeromq + @msgpack/msgpack) of
// vLLM-format KV events feeds a running proxy worker; the edge's KV index
// reflects the stored blocks (integer and bytes engine hashes, chained
// through a parent), then their removal, in both msgspec layouts.
func TestNodePublisherFeedsProxyWorker(t *testing.T) {
	dir := nodePublisherDir(t)
	for _, layout := range []string{"map", "array"} {
		t.Run(layout, func(t *testing.T) {
			pub := startNodePublisher(t, dir, layout)
			ns := natstest.Start(t, nil)
			startProxyWorker(t, ns, "w-node", pub.endpoint, pub.replay)
			f := newFleet(t, ns)

			toks := prefix.Tokenize(strings.Repeat("one two three four five six seven eight ", 3)) // 24 tokens: 6 blocks of 4
			blocks := prefix.BlockHashes(toks, 4)
			nudge := func() { pub.send(map[string]any{"dp": 0, "events": []any{}}) }
			pub.send(map[string]any{"dp": 0, "events": []any{
				map[string]any{"type": "stored", "hashes": []any{11, 12, 13}, "parent": nil, "tokens": toks[:12], "block_size": 4},
			}})
			pub.send(map[string]any{"dp": 0, "events": []any{
				map[string]any{"type": "stored", "hashes": []any{map[string]string{"bytes": "aa01"}, map[string]string{"bytes": "aa02"}, map[string]string{"bytes": "aa03"}},
					"parent": 13, "tokens": toks[12:], "block_size": 4},
			}})
			waitNudging(t, "the edge to index the 6 blocks on rank 0", nudge, func() bool {
				n, r := matchRank(f, "w-node", blocks)
				return n == 6 && r == 0
			})
			pub.send(map[string]any{"dp": 0, "events": []any{
				map[string]any{"type": "removed", "hashes": []any{map[string]string{"bytes": "aa03"}, map[string]string{"bytes": "aa02"}}},
			}})
			waitNudging(t, "the removal of the last 2 blocks", nudge, func() bool { n, _ := matchRank(f, "w-node", blocks); return n == 4 })
			pub.send(map[string]any{"dp": 0, "events": []any{map[string]any{"type": "removed", "hashes": []any{11}}}})
			waitNudging(t, "the removal of the first block", nudge, func() bool { n, _ := matchRank(f, "w-node", blocks); return n == 0 })
		})
	}
}
