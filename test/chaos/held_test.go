package chaos

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster/pki"
)

// TestChaosHeld keeps what held in the adversarial run against the
// deployment as deploy/ ships it (no TestChaos departures): a long-paused
// leader, a crash loop of edge kills, a long NATS outage, bad input on every
// port, and the admin and Raft authentication, each under client load and
// judged by the same checks as TestChaos (every answer against the log's
// placements, state hashes, the archive's replay). Short forms in make
// test; -long / RELIABILITY_LONG the adversarial run's sizes (a 10 s pause,
// 7 kills, a 20 s outage).
func TestChaosHeld(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: not in -short")
	}
	pause, kills, outage := 4*time.Second, 2, 3*time.Second
	if longMode() {
		pause, kills, outage = 10*time.Second, 7, 20*time.Second
	}
	v := newEnv(t)
	cases := []struct {
		name string
		// noUnhealthy: every worker stays up: no request may fail for want
		// of a healthy instance.
		noUnhealthy bool
		run         func(t *testing.T, mark func(string)) string
	}{
		{"paused-leader", false, func(t *testing.T, mark func(string)) string {
			l := v.waitLeader(20 * time.Second)
			mark("*")
			l.signal(syscall.SIGSTOP)
			stopped := time.Now()
			var took time.Duration
			waitFor(t, 30*time.Second, "a new leader while the old one is paused", func() bool {
				n := v.leader()
				took = time.Since(stopped)
				return n != nil && n != l
			})
			rest := time.NewTimer(max(0, pause-time.Since(stopped)))
			<-rest.C // hold the pause (schedule)
			mark(l.id)
			l.signal(syscall.SIGCONT)
			return fmt.Sprintf("paused=%s new_leader_after=%s", pause, took.Round(10*time.Millisecond))
		}},
		{"crash-loop", false, func(t *testing.T, mark func(string)) string {
			var killed []string
			for i := range kills {
				e := v.edges[i%len(v.edges)]
				if i%2 == 0 {
					e = v.waitLeader(20 * time.Second)
				}
				mark("*")
				_ = e.stop(syscall.SIGKILL, time.Second)
				killed = append(killed, e.id)
				mark(e.id)
				e.start(t)
				v.waitReady(60 * time.Second)
			}
			for _, e := range v.edges {
				v.auditVerify(e) // every edge's archive replays to its live hash
			}
			return fmt.Sprintf("kills=%d %v", kills, killed)
		}},
		{"nats-outage", true, func(t *testing.T, mark func(string)) string {
			v.stopNATS()
			down := time.NewTimer(outage)
			<-down.C // the outage (schedule)
			v.startNATS()
			return fmt.Sprintf("outage=%s", outage)
		}},
		{"bad-input-every-port", true, func(t *testing.T, mark func(string)) string {
			return v.badInputEveryPort(t)
		}},
		{"authentication", true, func(t *testing.T, mark func(string)) string {
			return v.authenticationHolds(t)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v.t = t
			defer func() { v.t = t }()
			restarts := map[string][]time.Time{}
			mark := func(id string) { restarts[id] = append(restarts[id], time.Now()) }
			ld := startLoad(v, fmt.Sprintf("held-%s-%d", c.name, time.Now().UnixNano()%1e6), 30, 12)
			warm := time.NewTimer(1500 * time.Millisecond)
			<-warm.C // keys bind before the fault (schedule)
			start := time.Now()
			detail := c.run(t, mark)
			v.waitReady(60 * time.Second)
			after := time.NewTimer(1500 * time.Millisecond)
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
			t.Logf("FIGURES held case=%s %s requests=%d sent=%d succeeded=%d retried=%d failed=%d refusals=%v %s lost_bindings=%d fault_and_recovery=%s state_index=%d hash=%s…",
				c.name, detail, len(samples), ld.sent.Load(), ok, ld.retried.Load(), ld.failed.Load(), ld.refusals, vd.Verdict, vd.lost,
				time.Since(start).Round(time.Millisecond), index, hash[:12])
			if vd.Wrong != 0 {
				t.Errorf("%d wrong answers", vd.Wrong)
			}
			if ld.failed.Load() != 0 {
				t.Errorf("%d requests failed on every edge: %v", ld.failed.Load(), failureReasons(samples))
			}
			if c.noUnhealthy {
				for _, s := range samples {
					if !s.ok && strings.Contains(s.lastErr, "no_healthy_instance") {
						t.Errorf("a request failed with no_healthy_instance although every worker was up (%s)", s.lastErr)
						break
					}
				}
			}
		})
	}
}

// badInputEveryPort sends malformed traffic to every port of the
// deployment — the edges' API, their Raft ports, the workers' API and the
// NATS port — and checks each answers with a 4xx in the API's error shape
// (HTTP ports) or closes the connection (the others), never a 5xx, and
// keeps serving. Returns the figures.
func (v *env) badInputEveryPort(t *testing.T) string {
	t.Helper()
	cl := &http.Client{Transport: v.transport(4), Timeout: 10 * time.Second}
	defer cl.Transport.(*http.Transport).CloseIdleConnections()
	bodies := []struct{ name, ctype, body string }{
		{"malformed JSON", "application/json", `{"model":`},
		{"wrong types", "application/json", `{"model":1,"messages":"x"}`},
		{"empty messages", "application/json", `{"model":"` + model + `","messages":[]}`},
		{"empty body", "application/json", ``},
		{"unknown model", "application/json", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`},
		{"not JSON", "text/plain", "hello"},
		{"array", "application/json", `[1,2,3]`},
		{"deep nesting", "application/json", strings.Repeat("[", 100000)},
		{"message not an object", "application/json", `{"model":"` + model + `","messages":[1]}`},
		{"negative max_tokens", "application/json", `{"model":"` + model + `","messages":[{"role":"user","content":"x"}],"max_tokens":-5}`},
	}
	httpCases, fiveXX := 0, 0
	check := func(where, name string, resp *http.Response, err error) {
		if err != nil {
			t.Errorf("%s %s: %v", where, name, err)
			return
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		httpCases++
		if resp.StatusCode >= 500 {
			fiveXX++
			t.Errorf("%s %s: %d %s", where, name, resp.StatusCode, b)
			return
		}
		if resp.StatusCode < 400 || !bytes.Contains(b, []byte(`"error"`)) {
			t.Errorf("%s %s: %d %s, want a 4xx error in the API's shape", where, name, resp.StatusCode, b)
		}
	}
	var targets []string
	for _, e := range v.edges {
		targets = append(targets, e.url())
	}
	for _, w := range v.workers {
		targets = append(targets, "https://"+w.addr)
	}
	for _, base := range targets {
		for _, b := range bodies {
			req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(b.body))
			req.Header.Set("Content-Type", b.ctype)
			resp, err := cl.Do(req)
			check(base, b.name, resp, err)
		}
		resp, err := cl.Get(base + "/v1/no-such-endpoint")
		check(base, "unknown endpoint", resp, err)
	}
	// Edges: header-level errors, in the API's shape too.
	for _, e := range v.edges {
		for _, raw := range []string{
			"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n",
			"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nX-A: " + strings.Repeat("a", 2<<20) + "\r\nContent-Length: 0\r\n\r\n",
		} {
			c, err := tls.Dial("tcp", e.httpAddr, v.pki.clientTLS())
			if err != nil {
				t.Errorf("%s: %v", e.id, err)
				continue
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			go func() { _, _ = io.WriteString(c, raw) }()
			b, _ := io.ReadAll(io.LimitReader(c, 1<<16))
			c.Close()
			httpCases++
			if !bytes.HasPrefix(b, []byte("HTTP/1.1 4")) || !bytes.Contains(b, []byte(`"error"`)) {
				t.Errorf("%s header-level error: %.200q, want a 4xx in the API's shape", e.id, b)
			}
		}
	}
	// Raft ports and the NATS port: garbage closes the connection.
	rawPorts := []string{v.natsAddr()}
	for _, e := range v.edges {
		rawPorts = append(rawPorts, e.raftAddr)
	}
	garbage := [][]byte{[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), bytes.Repeat([]byte{0xff}, 4096), {0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5}}
	rawCases := 0
	for _, addr := range rawPorts {
		for _, g := range garbage {
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				t.Errorf("dial %s: %v", addr, err)
				continue
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			_, _ = c.Write(g)
			_, _ = io.Copy(io.Discard, io.LimitReader(c, 1<<20)) // until the server closes or the deadline
			c.Close()
			rawCases++
		}
	}
	for _, e := range v.edges {
		if !e.running() {
			t.Errorf("%s exited after the bad input", e.id)
		}
	}
	return fmt.Sprintf("http_cases=%d http_5xx=%d raw_cases=%d ports=%d", httpCases, fiveXX, rawCases, len(targets)+len(rawPorts))
}

// authenticationHolds checks, against the running deployment, that the
// admin API takes only its token on every edge and that the Raft port
// takes only edge certificates naming the node they claim. Returns the
// figures.
func (v *env) authenticationHolds(t *testing.T) string {
	t.Helper()
	cl := &http.Client{Transport: v.transport(4), Timeout: 10 * time.Second}
	defer cl.Transport.(*http.Transport).CloseIdleConnections()
	refused := 0
	for _, e := range v.edges {
		for _, auth := range []string{"", "Bearer wrong-token-0123456789", "Bearer " + internalKey, "Basic " + adminToken} {
			for _, route := range []string{"GET cluster", "GET instances", "GET snapshot", "GET bindings/context/x", "POST raft/remove-peer", "POST snapshot/restore"} {
				method, path, _ := strings.Cut(route, " ")
				req, _ := http.NewRequest(method, e.url()+"/admin/v1/"+path, nil)
				if auth != "" {
					req.Header.Set("Authorization", auth)
				}
				resp, err := cl.Do(req)
				if err != nil {
					t.Errorf("%s admin %s: %v", e.id, path, err)
					continue
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusUnauthorized {
					t.Errorf("%s admin %s with %q: %d, want 401", e.id, path, auth, resp.StatusCode)
					continue
				}
				refused++
			}
		}
	}
	// The Raft port: no certificate, a worker's, another node's.
	ci0, err := v.cluster(v.edges[0])
	if err != nil {
		t.Fatal(err)
	}
	worker, err := v.pki.ca.Issue("ctx-9", pki.IssueOptions{Role: pki.RoleWorker, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	other, err := v.pki.ca.Issue("edge-9", pki.IssueOptions{Role: pki.RoleEdge, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	raftRefused := 0
	for _, e := range v.edges {
		for name, certs := range map[string][]tls.Certificate{"none": nil, "worker": {worker.TLS}, "unknown edge": {other.TLS}} {
			cfg := &tls.Config{RootCAs: v.pki.ca.Pool(), Certificates: certs, MinVersion: tls.VersionTLS13, ServerName: "127.0.0.1"}
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", e.raftAddr, cfg)
			if err == nil {
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				_, err = c.Write([]byte{0x00, 0x01, 0x02})
				if err == nil {
					var b [1]byte
					_, err = c.Read(b[:])
				}
				c.Close()
			}
			if err == nil {
				t.Errorf("%s Raft port accepted a connection with %s certificate", e.id, name)
				continue
			}
			raftRefused++
		}
	}
	ci1, err := v.cluster(v.edges[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(ci1.Peers) != len(ci0.Peers) {
		t.Errorf("membership changed: %d peers → %d", len(ci0.Peers), len(ci1.Peers))
	}
	return fmt.Sprintf("admin_refused=%d raft_refused=%d", refused, raftRefused)
}

// natsAddr is the NATS server's host:port.
func (v *env) natsAddr() string { return strings.TrimPrefix(v.natsURL, "nats://") }
