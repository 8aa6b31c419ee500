package chaos

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestChaosDiskFull: a follower edge whose disk fills while its peers go on.
// Its data dir is a small tmpfs (the test mounts one when it may: root on
// Linux), filled to the last byte under client load; where it may not
// mount, the same edge's file size is capped to what its files hold
// (prlimit --fsize on the running process: writes that must grow a file
// fail with EFBIG). Either way raft.db (or the archive) stops taking writes
// and the edge's state stops following the leader's. The edge must then
// report not ready, and answer routed requests 503 state_stalled with
// Retry-After instead of serving them from a frozen state (it used to stay
// ready, serving at p50 ~1 s while cluster throughput fell ~10×); the
// other edges keep serving every request. Once space is back the edge
// catches up (or, if it halted or exited, restarts cleanly on its data
// dir) and every edge converges on one state hash; the archive replays to
// it. Short: 20 s of fullness at most; -long: the space stays gone 30 s
// after the edge reported stalled.
func TestChaosDiskFull(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: not in -short")
	}
	hold := 3 * time.Second
	if longMode() {
		hold = 30 * time.Second
	}
	v := newEnv(t)
	l := v.waitLeader(20 * time.Second)
	var e *edgeProc
	for _, x := range v.edges {
		if x != l {
			e = x
			break
		}
	}

	fill := newDiskFiller(t, v, e)
	defer fill.undo()
	v.waitReady(60 * time.Second)

	restarts := map[string][]time.Time{}
	ld := startLoad(v, fmt.Sprintf("disk-%d", time.Now().UnixNano()%1e6), 30, 12)
	warm := time.NewTimer(time.Second)
	<-warm.C // keys bind before the fault (schedule)

	filledAt := time.Now()
	fill.fill()
	stopGrowth := make(chan struct{})
	grown := make(chan int)
	go func() { grown <- growLog(v, e, stopGrowth) }()

	var reason string
	var exited bool
	waitFor(t, 60*time.Second, e.id+" reporting itself not ready (or exiting) with its disk full", func() bool {
		if !e.running() {
			exited = true
			return true
		}
		st, body := v.readyz(e)
		if st == http.StatusServiceUnavailable && (strings.Contains(body, "stalled") || strings.Contains(body, "halted")) {
			reason = body
			return true
		}
		return false
	})
	detect := time.Since(filledAt)
	if exited {
		_, err := e.exited(0)
		t.Logf("disk full: %s exited (%v); log tail:\n%s", e.id, err, e.tail(15))
	}

	// While stalled, routed requests to it are refused with Retry-After.
	refused, served, probes := 0, 0, 0
	if !exited {
		end := time.Now().Add(hold)
		c := &http.Client{Transport: v.transport(4), Timeout: 10 * time.Second}
		for i := 0; time.Now().Before(end); i++ {
			st, hdr, body, err := postChat(c, e, fmt.Sprintf("disk-probe-%d", i))
			if err != nil {
				continue
			}
			probes++
			switch {
			case st == http.StatusServiceUnavailable && strings.Contains(body, "state_stalled") && hdr.Get("Retry-After") != "":
				refused++
			case st == http.StatusOK:
				served++
			default:
				t.Errorf("a stalled edge answered %d %s (Retry-After %q)", st, body, hdr.Get("Retry-After"))
			}
			time.Sleep(100 * time.Millisecond) // probe pacing (schedule)
		}
		c.Transport.(*http.Transport).CloseIdleConnections()
	}
	close(stopGrowth)
	t.Logf("disk full: %d new conversations sent meanwhile", <-grown)

	fill.undo()
	freedAt := time.Now()
	restarted := false
	if !exited && !e.running() {
		// It reported itself halted, then exited as a halted node does:
		// on a busy host the exit can come after the report was read.
		exited = true
		t.Logf("disk full: %s exited after reporting %q", e.id, truncateReason(reason))
	}
	if exited || v.halted(e) {
		_ = e.stop(syscall.SIGTERM, 30*time.Second)
		restarts[e.id] = append(restarts[e.id], time.Now())
		e.start(t)
		restarted = true
	}
	v.waitReady(90 * time.Second)
	recovered := time.Since(freedAt)
	after := time.NewTimer(time.Second)
	<-after.C // traffic after the heal (schedule)
	samples := ld.finish()
	hash, index := v.converge(60 * time.Second)
	vd := v.checkRoutes(samples, restarts)
	v.auditVerify(v.waitLeader(20 * time.Second))
	ok := 0
	for _, s := range samples {
		if s.ok {
			ok++
		}
	}
	t.Logf("FIGURES diskfull mode=%s edge=%s detect=%s reason=%q exited=%v restarted=%v probes_while_stalled=%d refused_503_retry_after=%d served=%d requests=%d succeeded=%d retried=%d failed=%d refusals=%v recovered=%s %s state_index=%d hash=%s…",
		fill.mode, e.id, detect.Round(time.Millisecond), truncateReason(reason), exited, restarted, probes, refused, served,
		len(samples), ok, ld.retried.Load(), ld.failed.Load(), ld.refusals, recovered.Round(time.Millisecond), vd.Verdict, index, hash[:12])
	if served != 0 {
		t.Errorf("the stalled edge served %d requests from its frozen state", served)
	}
	if !exited && refused == 0 {
		t.Error("no routed request was refused by the stalled edge")
	}
	if ld.failed.Load() != 0 {
		t.Errorf("%d requests failed on every edge while one edge's disk was full", ld.failed.Load())
	}
	if vd.Wrong != 0 {
		t.Errorf("%d wrong answers", vd.Wrong)
	}
}

func truncateReason(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// readyz is e's /readyz status and body (0 when unreachable).
func (v *env) readyz(e *edgeProc) (int, string) {
	resp, err := v.client.Get(e.url() + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, string(b)
}

// halted reports whether e's node halted (admin cluster status).
func (v *env) halted(e *edgeProc) bool {
	ci, err := v.cluster(e)
	return err == nil && ci.Halted != ""
}

func postChat(c *http.Client, e *edgeProc, conv string) (int, http.Header, string, error) {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":1,"messages":[{"role":"user","content":%q}]}`, model, conv)
	req, _ := http.NewRequest("POST", e.url()+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-session-id", conv)
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, resp.Header, string(b), nil
}

// diskFiller takes an edge's disk space away and gives it back: a tmpfs
// data dir filled to the last byte, or, where mounting is not allowed, a
// file size limit on the running process at its files' current sizes.
type diskFiller struct {
	t      *testing.T
	v      *env
	e      *edgeProc
	mode   string // "tmpfs" or "fsize"
	filler string
	filled bool
}

// tmpfsSize is the data dir's tmpfs: room for the edge's files at start
// and some growth, filled up by fill.
const tmpfsSize = 64 << 20

func newDiskFiller(t *testing.T, v *env, e *edgeProc) *diskFiller {
	t.Helper()
	d := &diskFiller{t: t, v: v, e: e, mode: "fsize"}
	if os.Getenv("CHAOS_DISK_FSIZE") == "1" {
		return d // force the unprivileged form
	}
	probe := filepath.Join(v.dir, "tmpfs-probe")
	if err := os.MkdirAll(probe, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", probe).Run(); err != nil {
		t.Logf("disk full: cannot mount a tmpfs (%v): capping the edge's file size instead", err)
		return d
	}
	_ = exec.Command("umount", probe).Run()
	// Move the edge's data dir onto a tmpfs at the same path.
	if err := e.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Logf("stop %s: %v", e.id, err)
	}
	saved := e.dataDir + ".disk"
	if out, err := exec.Command("cp", "-a", "--sparse=never", e.dataDir, saved).CombinedOutput(); err != nil {
		t.Fatalf("copy %s: %v %s", e.dataDir, err, out)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+strconv.Itoa(tmpfsSize), "tmpfs", e.dataDir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs on %s: %v %s", e.dataDir, err, out)
	}
	t.Cleanup(func() {
		_ = e.stop(syscall.SIGTERM, 30*time.Second)
		_ = exec.Command("umount", "-l", e.dataDir).Run()
	})
	if out, err := exec.Command("cp", "-a", "--sparse=never", saved+"/.", e.dataDir).CombinedOutput(); err != nil {
		t.Fatalf("copy back into the tmpfs: %v %s", err, out)
	}
	_ = os.RemoveAll(saved)
	d.mode = "tmpfs"
	e.start(t)
	return d
}

// fill takes the space away.
func (d *diskFiller) fill() {
	d.t.Helper()
	switch d.mode {
	case "tmpfs":
		d.filler = filepath.Join(d.e.dataDir, "filler")
		f, err := os.Create(d.filler)
		if err != nil {
			d.t.Fatal(err)
		}
		buf := make([]byte, 1<<20)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					d.t.Fatalf("fill the tmpfs: %v", err)
				}
				break
			}
		}
		// The last partial page.
		for {
			if _, err := f.Write(buf[:512]); err != nil {
				break
			}
		}
		f.Close()
	case "fsize":
		var limit int64
		for _, name := range []string{"raft.db", "archive.db"} {
			if st, err := os.Stat(filepath.Join(d.e.dataDir, name)); err == nil {
				limit = max(limit, st.Size())
			}
		}
		d.setLimit(strconv.FormatInt(limit, 10))
	}
	d.filled = true
}

// undo gives the space back (idempotent).
func (d *diskFiller) undo() {
	if !d.filled {
		return
	}
	d.filled = false
	switch d.mode {
	case "tmpfs":
		_ = os.Remove(d.filler)
	case "fsize":
		if d.e.running() {
			d.setLimit("unlimited")
		}
	}
}

func (d *diskFiller) setLimit(limit string) {
	d.t.Helper()
	d.e.mu.Lock()
	pid := d.e.cmd.Process.Pid
	d.e.mu.Unlock()
	if out, err := exec.Command("prlimit", "--pid", strconv.Itoa(pid), "--fsize="+limit).CombinedOutput(); err != nil {
		d.t.Fatalf("prlimit --fsize=%s on %s: %v %s", limit, d.e.id, err, out)
	}
}
