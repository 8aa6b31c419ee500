package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/tether-project/tether/cluster/pki"
	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/test/leakcheck"
	"github.com/tether-project/tether/test/testbin"
	"github.com/tether-project/tether/test/waitfor"
)

var longFlag = flag.Bool("long", false, "run every nemesis (make soak)")

func longMode() bool { return *longFlag || os.Getenv("RELIABILITY_LONG") == "1" }

// tetherBin is the binary built once by TestMain.
var tetherBin string

func TestMain(m *testing.M) {
	if conf := os.Getenv(natsChildEnv); conf != "" {
		// This binary started as the deployment's NATS server in a
		// network namespace of its own (netnsEnv).
		os.Exit(serveNATS(conf))
	}
	flag.Parse()
	if testing.Short() {
		fmt.Println("chaos: skipped in -short mode")
		os.Exit(m.Run())
	}
	var err error
	if tetherBin, err = testbin.Tether(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		testbin.Remove()
		os.Exit(1)
	}
	code := m.Run()
	testbin.Remove()
	if code == 0 {
		// Every process is stopped by the tests; their goroutines (cmd.Wait,
		// NATS, HTTP clients) must be gone too.
		if err := leakcheck.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "chaos: leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// model is the deploy configurations' model (newEnv reads it).
var model = "chaos-model"

const (
	internalKey = "chaos-internal-key-0123456789"
	adminToken  = "chaos-admin-token-0123456789"
	parentHdr   = "X-Dynamo-Parent-Session-ID"
)

// handedOut holds every port freePort returned in this test binary: the
// kernel may give a released port to the next bind(0), and two members of
// one deployment on one port fail its bootstrap ("duplicate address").
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// freePort reserves a loopback port by binding and releasing it, never one
// it returned before.
func freePort(t *testing.T) int {
	t.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		handedOut.Lock()
		seen := handedOut.ports[port]
		handedOut.ports[port] = true
		handedOut.Unlock()
		if !seen {
			return port
		}
	}
	t.Fatal("no loopback port that was not handed out before")
	return 0
}

// proc is one tether process.
type proc struct {
	name    string
	args    []string
	env     []string // added to the test's environment (secrets, as deploy/README.md says)
	logPath string
	prefix  []string // e.g. prlimit --fsize=N --
	bin     string   // the program (tetherBin when empty)

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func (p *proc) start(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(logf, "\n==== start %s %v\n", time.Now().Format(time.RFC3339Nano), p.args)
	bin := p.bin
	if bin == "" {
		bin = tetherBin
	}
	argv := append(append([]string(nil), p.prefix...), bin)
	argv = append(argv, p.args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), p.env...)
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", p.name, err)
	}
	p.cmd, p.done, p.err = cmd, make(chan struct{}), nil
	done := p.done
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
}

func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(sig)
	}
}

// stop sends sig and waits for the exit (SIGKILL after the grace period).
func (p *proc) stop(sig syscall.Signal, grace time.Duration) error {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return nil
	}
	p.signal(syscall.SIGCONT) // a stopped process cannot act on SIGTERM
	p.signal(sig)
	select {
	case <-done:
	case <-time.After(grace):
		p.signal(syscall.SIGKILL)
		<-done
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// exited waits up to timeout for the process to exit on its own.
func (p *proc) exited(timeout time.Duration) (bool, error) {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	select {
	case <-done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return true, p.err
	case <-time.After(timeout):
		return false, nil
	}
}

func (p *proc) tail(n int) string {
	b, _ := os.ReadFile(p.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

type edgeProc struct {
	proc
	id, httpAddr, raftAddr, dataDir string
}

// url is the edge's HTTPS base URL (deploy's edges serve TLS).
func (e *edgeProc) url() string { return "https://" + e.httpAddr }

type workerProc struct {
	proc
	id    string
	fleet string
	addr  string // host:port of its HTTPS API
}

// env is the deployment under test, configured as deploy/ ships it
// (deploy_test.go): an external NATS server (in-process, deploy/nats's
// configuration), 3 edge processes and 2+2 worker processes on loopback,
// mutual TLS everywhere with the test's CA.
type env struct {
	t        *testing.T
	dir      string
	natsMu   sync.Mutex
	nats     *natsserver.Server
	natsOpts *natsserver.Options
	natsURL  string
	natsPort int
	// natsProc, when set, is the NATS server as a process of its own (in
	// its network namespace) instead of in the test process; natsReady
	// reports when it accepts connections.
	natsProc  *proc
	natsReady func() bool
	// nkeys are the workers' NATS identities (deploy/nats/auth.conf pins
	// each to its instance id).
	nkeys   map[string]nkeys.KeyPair
	edges   []*edgeProc
	workers []*workerProc
	pki     *testPKI
	client  *http.Client
}

// envOptions are a test's departures from the shipped configuration.
type envOptions struct {
	// edge: dotted config path → value, applied after the deploy file.
	edge map[string]any
	// worker: the same for every worker (after the harness's own values).
	worker map[string]any
}

// nemesisOverrides are TestChaos's departures from deploy's edge configs:
// workers are declared down after 2 s of silence (deploy: 15 s) so that
// the kill-worker nemesis fits a test; saturation overflow, relief and
// shedding are off so that a detour from a binding is a recorded overflow
// of an unhealthy instance or a violation, nothing else.
var nemesisOverrides = map[string]any{
	"telemetry.down_after":                     "2s",
	"placement.overflow.queued_requests":       1048576,
	"placement.overflow.active_prompt_tokens":  1099511627776,
	"placement.overflow.relief_factor":         0,
	"placement.shed.max_queued_requests":       2097152,
	"placement.shed.max_queued_prefill_tokens": 2199023255552,
	"placement.shed.max_backlog_seconds":       0,
	"context_servers.num_instances":            2,
	"generation_servers.num_instances":         2,
}

// transport is an HTTP transport that trusts the deployment's CA.
func (v *env) transport(maxIdle int) *http.Transport {
	return &http.Transport{MaxIdleConnsPerHost: maxIdle, TLSClientConfig: v.pki.clientTLS()}
}

func (v *env) startNATS() {
	v.t.Helper()
	v.natsMu.Lock()
	defer v.natsMu.Unlock()
	if v.natsProc != nil {
		v.natsProc.start(v.t)
		waitFor(v.t, 20*time.Second, "the NATS process to accept connections", v.natsReady)
		return
	}
	var ns *natsserver.Server
	waitFor(v.t, 10*time.Second, "NATS to listen on its port", func() bool {
		var err error
		ns, err = natsserver.NewServer(v.natsOpts.Clone())
		if err != nil {
			return false
		}
		go ns.Start()
		if !ns.ReadyForConnections(5 * time.Second) {
			ns.Shutdown()
			ns.WaitForShutdown()
			return false
		}
		return true
	})
	v.nats = ns
}

func (v *env) stopNATS() {
	v.natsMu.Lock()
	defer v.natsMu.Unlock()
	if v.natsProc != nil {
		_ = v.natsProc.stop(syscall.SIGTERM, 10*time.Second)
		return
	}
	if v.nats != nil {
		v.nats.Shutdown()
		v.nats.WaitForShutdown()
		v.nats = nil
	}
}

func newEnv(t *testing.T) *env { return newEnvWith(t, envOptions{}) }

func newEnvWith(t *testing.T, o envOptions) *env {
	t.Helper()
	v := &env{t: t, dir: t.TempDir()}
	v.pki = newTestPKI(t, v.dir)
	tr := v.transport(64)
	v.client = &http.Client{Transport: tr, Timeout: 20 * time.Second}
	v.natsPort = freePort(t)
	v.natsURL = fmt.Sprintf("nats://127.0.0.1:%d", v.natsPort)
	v.nkeys = workerNKeys(t, []string{"ctx-1", "ctx-2", "gen-1", "gen-2"})
	v.natsOpts = natsOptions(t, v.dir, fmt.Sprintf("127.0.0.1:%d", v.natsPort), v.nkeys)
	v.startNATS()
	v.stopAtEnd(tr)
	if m := yamlGet(readDeployYAML(t, "config/edge-1.yaml"), "model"); m != "" {
		model = m
	}

	for i, fleet := range []string{"context", "context", "generation", "generation"} {
		id := fmt.Sprintf("%s-%d", map[string]string{"context": "ctx", "generation": "gen"}[fleet], i%2+1)
		port := freePort(t)
		files := v.pki.issue(t, id, pki.RoleWorker)
		seed := filepath.Join(v.dir, id+".nk")
		if err := os.WriteFile(seed, []byte(seedOf(t, v.nkeys[id])+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(v.dir, id+".yaml")
		set := map[string]any{
			"instance_id":         id,
			"hostname":            "127.0.0.1",
			"port":                port,
			"advertise_url":       fmt.Sprintf("https://127.0.0.1:%d", port),
			"model":               model,
			"engine":              map[string]any{"type": "sim", "time_scale": 0},
			"tls.ca_file":         files.CA,
			"tls.cert_file":       files.Cert,
			"tls.key_file":        files.Key,
			"nats.urls":           []string{v.natsURL},
			"nats.nkey_seed_file": seed,
		}
		for k, val := range o.worker {
			set[k] = val
		}
		writeDeployConfig(t, "config/worker-"+fleet+".yaml", path, set)
		w := &workerProc{id: id, fleet: fleet, addr: fmt.Sprintf("127.0.0.1:%d", port)}
		w.name, w.args, w.logPath = id, []string{"worker", "--config", path}, filepath.Join(v.dir, id+".log")
		w.env = secretsEnv()
		w.start(t)
		v.workers = append(v.workers, w)
	}

	var peers []any
	for i := range 3 {
		e := &edgeProc{id: fmt.Sprintf("edge-%d", i+1)}
		e.httpAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		e.raftAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		e.dataDir = filepath.Join(v.dir, e.id)
		peers = append(peers, map[string]any{"id": e.id, "addr": e.raftAddr})
		v.edges = append(v.edges, e)
	}
	for i, e := range v.edges {
		_, portStr, _ := net.SplitHostPort(e.httpAddr)
		port, _ := strconv.Atoi(portStr)
		files := v.pki.issue(t, e.id, pki.RoleEdge)
		set := map[string]any{
			"hostname":               "127.0.0.1",
			"port":                   port,
			"trusted_gateway.cidrs":  []string{"127.0.0.0/8"},
			"debug_route_header":     true,
			"cluster.node_id":        e.id,
			"cluster.bind_addr":      e.raftAddr,
			"cluster.advertise_addr": e.raftAddr,
			"cluster.data_dir":       e.dataDir,
			"cluster.peers":          peers,
			"tls.ca_file":            files.CA,
			"tls.cert_file":          files.Cert,
			"tls.key_file":           files.Key,
			"nats.urls":              []string{v.natsURL},
		}
		if d := os.Getenv("CHAOS_PROPOSE_TIMEOUT"); d != "" {
			// To measure another value than the shipped one.
			set["cluster.propose_timeout"] = d
		}
		for k, val := range o.edge {
			set[k] = val
		}
		path := filepath.Join(v.dir, e.id+".yaml")
		writeDeployConfig(t, fmt.Sprintf("config/edge-%d.yaml", i+1), path, set)
		e.name, e.args, e.logPath = e.id, []string{"edge", "--config", path}, filepath.Join(v.dir, e.id+".log")
		e.env = secretsEnv()
		e.start(t)
	}
	v.waitReady(60 * time.Second)
	return v
}

// admin GETs /admin/v1/<path> on e.
func (v *env) admin(ctx context.Context, e *edgeProc, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, "GET", e.url()+"/admin/v1/"+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := v.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s %s: HTTP %d: %s", e.id, path, resp.StatusCode, b)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

func (v *env) cluster(e *edgeProc) (admin.ClusterInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var ci admin.ClusterInfo
	err := v.admin(ctx, e, "cluster", &ci)
	return ci, err
}

// leader is the edge process that reports itself the ready leader.
func (v *env) leader() *edgeProc {
	for _, e := range v.edges {
		if !e.running() {
			continue
		}
		if ci, err := v.cluster(e); err == nil && ci.IsLeader {
			return e
		}
	}
	return nil
}

// waitLeader is the leader edge, waited for up to timeout: right after a
// fault, or while a status request times out on a loaded machine, no edge
// may answer as leader for a moment.
func (v *env) waitLeader(timeout time.Duration) *edgeProc {
	v.t.Helper()
	var l *edgeProc
	waitFor(v.t, timeout, "an edge answering as leader", func() bool {
		l = v.leader()
		return l != nil
	})
	return l
}

// waitReady waits for every running edge's /readyz and a leader.
func (v *env) waitReady(timeout time.Duration) {
	v.t.Helper()
	waitFor(v.t, timeout, "every edge ready with a leader", func() bool {
		for _, e := range v.edges {
			if !e.running() {
				continue
			}
			resp, err := v.client.Get(e.url() + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return false
			}
		}
		return v.leader() != nil
	})
}

// converge waits until every edge reports the same state hash at the same
// index, and returns it.
func (v *env) converge(timeout time.Duration) (string, uint64) {
	v.t.Helper()
	var hash string
	var index uint64
	var last map[string]string
	deadline := time.Now().Add(timeout)
	for {
		last = map[string]string{}
		hash, index = "", 0
		agree := true
		for _, e := range v.edges {
			ci, err := v.cluster(e)
			if err != nil {
				agree = false
				break
			}
			last[e.id] = fmt.Sprintf("%d:%s", ci.StateIndex, ci.StateHash)
			if hash == "" {
				hash, index = ci.StateHash, ci.StateIndex
			} else if ci.StateIndex != index {
				agree = false
			} else if ci.StateHash != hash {
				v.t.Fatalf("state hashes differ at equal index %d: %v", index, last)
			}
		}
		if agree && hash != "" {
			return hash, index
		}
		if time.Now().After(deadline) {
			v.t.Fatalf("edges did not converge within %s: %v", timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// auditVerify copies an edge's data directory and runs `tether audit
// verify` against that edge: the archive must replay to its live hash.
func (v *env) auditVerify(e *edgeProc) {
	v.t.Helper()
	cp := filepath.Join(v.dir, fmt.Sprintf("audit-%s-%d", e.id, time.Now().UnixNano()))
	if out, err := exec.Command("cp", "-r", e.dataDir, cp).CombinedOutput(); err != nil {
		v.t.Fatalf("copy %s: %v: %s", e.dataDir, err, out)
	}
	cmd := exec.Command(tetherBin, "audit", "verify", "--data-dir", cp, "--edge", e.url(), "--admin-token", adminToken, "--cacert", v.pki.caFile)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		v.t.Fatalf("tether audit verify on a copy of %s: %v\n%s", e.id, err, out.String())
	}
	os.RemoveAll(cp)
}

// waitFor polls cond until it holds or the deadline passes.
var waitFor = waitfor.True

var errNoEdge = errors.New("no edge answered")

// stopAtEnd stops the env's processes when the test ends (edges first,
// then workers, then NATS) and, for a failed test, logs each edge's tail.
func (v *env) stopAtEnd(tr *http.Transport) {
	v.t.Cleanup(func() {
		for _, e := range v.edges {
			_ = e.stop(syscall.SIGTERM, 20*time.Second)
		}
		for _, w := range v.workers {
			_ = w.stop(syscall.SIGTERM, 10*time.Second)
		}
		v.stopNATS()
		tr.CloseIdleConnections()
		if v.t.Failed() {
			for _, e := range v.edges {
				v.t.Logf("---- %s log tail:\n%s", e.id, e.tail(30))
			}
		}
	})
}

// admissionTimeline samples each edge's admission state every 2 s for
// the given number of seconds (the load's schedule), stamped from start.
func (v *env) admissionTimeline(seconds int, start time.Time) []string {
	var timeline []string
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	run := time.NewTimer(time.Duration(seconds) * time.Second)
	for {
		select {
		case <-run.C: // the load's schedule
			return timeline
		case <-tick.C:
			timeline = append(timeline, fmt.Sprintf("t=%.0fs %s", time.Since(start).Seconds(), v.admissionState()))
		}
	}
}
