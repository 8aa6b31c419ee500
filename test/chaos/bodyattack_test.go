package chaos

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBodySizeAttackRSS measures (it does not assert) the resident memory of
// an edge process configured as deploy/ ships it (max_body_bytes 32 MiB,
// max_inflight_body_bytes 64 MiB) while 8 clients each send a ~31 MB chat
// body to it at once (without the in-flight budget, the
// process went from 140 MB to 2.5 GB RSS and the cluster saw seconds of
// leaderless elections). A measurement for RELIABILITY.md, so only with
// -long / RELIABILITY_LONG=1:
//
//	RELIABILITY_LONG=1 go test -count=1 -v -run TestBodySizeAttackRSS ./test/chaos/
func TestBodySizeAttackRSS(t *testing.T) {
	if testing.Short() || !longMode() {
		t.Skip("a measurement: runs with -long or RELIABILITY_LONG=1")
	}
	const clients, size = 8, 31 << 20
	v := newEnv(t)
	target := v.edges[0]
	pid := target.pid()
	ci0, err := v.cluster(target)
	if err != nil {
		t.Fatal(err)
	}
	rss0, hwm0 := procMemKB(t, pid)

	body := attackBody(size)
	tr := v.transport(clients)
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 5 * time.Minute}
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		peak  int64
		stop  = make(chan struct{})
		polls sync.WaitGroup
	)
	polls.Add(1)
	go func() { // samples the current RSS (VmHWM keeps the peak anyway)
		defer polls.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if rss, _, ok := readProcMem(pid); ok {
					mu.Lock()
					peak = max(peak, rss)
					mu.Unlock()
				}
			}
		}
	}()
	// Three rounds: the first shows the peak, the next whether it grows.
	for round := 1; round <= 3; round++ {
		codes := map[string]int{}
		start := time.Now()
		for i := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest("POST", target.url()+"/v1/chat/completions", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("x-session-id", fmt.Sprintf("big-body-%d-%d", round, i))
				resp, err := c.Do(req)
				key := ""
				if err != nil {
					key = "transport: " + errClass(err)
				} else {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					var e struct {
						Error struct {
							Code string `json:"code"`
						} `json:"error"`
					}
					_ = json.Unmarshal(b, &e)
					key = strings.TrimSpace(fmt.Sprintf("%d %s", resp.StatusCode, e.Error.Code))
				}
				mu.Lock()
				codes[key]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		took := time.Since(start)
		rss1, hwm1 := procMemKB(t, pid)
		ci1, err := v.cluster(target)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		p := peak
		mu.Unlock()
		t.Logf("FIGURES body_attack round=%d clients=%d body_bytes=%d (shipped max_body_bytes, max_inflight_body_bytes) answers=%v took=%s rss_before_kb=%d peak_rss_sampled_kb=%d hwm_before_kb=%d hwm_after_kb=%d rss_after_kb=%d term_before=%d term_after=%d leader_before=%s leader_after=%s",
			round, clients, len(body), codes, took.Round(time.Millisecond), rss0, p, hwm0, hwm1, rss1, ci0.Term, ci1.Term, ci0.Leader, ci1.Leader)
	}
	close(stop)
	polls.Wait()
	if !target.running() {
		t.Fatalf("the edge exited under the attack:\n%s", target.tail(30))
	}
}

// attackBody is a chat request of about size bytes: one user message of
// words (the edge tokenizes it, as it would a real prompt).
func attackBody(size int) []byte {
	words := strings.Repeat("tether routes conversations to their cache ", size/43+1)
	b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 1,
		"messages": []map[string]string{{"role": "user", "content": words[:size-100]}}})
	return b
}

// pid is the running process's id.
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

func procMemKB(t *testing.T, pid int) (rss, hwm int64) {
	t.Helper()
	rss, hwm, ok := readProcMem(pid)
	if !ok {
		t.Fatalf("no /proc/%d/status", pid)
	}
	return rss, hwm
}

// readProcMem reads VmRSS and VmHWM (peak RSS) in kB from /proc/pid/status.
func readProcMem(pid int) (rss, hwm int64, ok bool) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, found := strings.Cut(sc.Text(), ":")
		if !found {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			rss = n
		case "VmHWM":
			hwm = n
		}
	}
	return rss, hwm, rss > 0
}
