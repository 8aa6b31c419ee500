package reliability

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/cluster/pki"
	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/clustertest"
	"github.com/tether-project/tether/test/edgetest"
	"github.com/tether-project/tether/test/testhttp"
	"github.com/tether-project/tether/test/waitfor"
	"github.com/tether-project/tether/test/workertest"
	"github.com/tether-project/tether/worker"
)

// Transport security through the components' own configuration: edges and
// workers configured with tls.mode: mutual and certificate files from one
// CA (pki), attacked by peers holding no certificate, a certificate from
// another CA, an expired one, or one the CA issued for someone else.

const secureKey = "reliability-secure-internal-key-0123"

// secureCA is a CA whose certificate files live in a temporary directory.
type secureCA struct {
	*pki.CA
	dir string
}

func newSecureCA(t *testing.T, name string) *secureCA {
	t.Helper()
	ca, err := pki.NewCA(name, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &secureCA{CA: ca, dir: t.TempDir()}
}

func (c *secureCA) leaf(t *testing.T, id string, o pki.IssueOptions) *pki.Leaf {
	t.Helper()
	l, err := c.Issue(id, o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// files issues id's certificate in role and writes it next to the CA.
func (c *secureCA) files(t *testing.T, id string, role pki.Role) pki.Files {
	t.Helper()
	f, err := c.WriteFiles(c.dir, id, c.leaf(t, id, pki.IssueOptions{Role: role}))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// presenting is a client configuration that trusts ca and presents leaf
// (nil: no certificate) even when the server would not accept its issuer.
func presenting(ca *secureCA, leaf *pki.Leaf) *tls.Config {
	c := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	if leaf != nil {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &leaf.TLS, nil }
	}
	return c
}

func tlsHTTPClient(t *testing.T, c *tls.Config) *http.Client { return testhttp.Client(t, c) }

// startSecureWorker runs a worker of fleet over mutual TLS that takes
// requests from edges' certificates only (client_auth require).
func startSecureWorker(t *testing.T, ca *secureCA, id string, fleet telemetry.Fleet) *worker.Server {
	t.Helper()
	return startSecureWorkerLogged(t, ca, id, fleet, nil)
}

// startSecureWorkerLogged is startSecureWorker logging into logs (nil: the
// suite's logger).
func startSecureWorkerLogged(t *testing.T, ca *secureCA, id string, fleet telemetry.Fleet, logs *logLines) *worker.Server {
	t.Helper()
	f := ca.files(t, id, pki.RoleWorker)
	cfg := worker.DefaultConfig()
	cfg.InstanceID = id
	cfg.Fleet = fleet
	cfg.Model = "test-model"
	cfg.InternalRequestAuthKey = secureKey
	cfg.Engine.TimeScale = 0
	cfg.Logger = logger()
	if logs != nil {
		cfg.Logger = logs.logger()
	}
	cfg.TLS = worker.ServerTLSConfig{Mode: worker.TLSModeMutual, CAFile: f.CA, CertFile: f.Cert, KeyFile: f.Key,
		HTTPClientAuth: worker.ClientAuthRequire, AllowedClients: []string{pki.IdentityURI(pki.RoleEdge, "*")}}
	return workertest.Start(t, worker.New, cfg)
}

// secureEdge is a running edge and its registry.
type secureEdge struct {
	e   *edge.Edge
	reg *prometheus.Registry
}

// startSecureEdges bootstraps n edges configured with tls.mode: mutual,
// each certificate issued by certCA for its node id (files trusting
// trustCA), routing to the given static workers.
func startSecureEdges(t *testing.T, trustCA, certCA *secureCA, n int, workers map[telemetry.Fleet]*worker.Server, tweak func(*edge.Config)) []secureEdge {
	t.Helper()
	return startSecureEdgesLogged(t, trustCA, certCA, n, workers, tweak, nil)
}

// startSecureEdgesLogged is startSecureEdges with every edge logging into
// logs (nil: the suite's logger).
func startSecureEdgesLogged(t *testing.T, trustCA, certCA *secureCA, n int, workers map[telemetry.Fleet]*worker.Server, tweak func(*edge.Config), logs *logLines) []secureEdge {
	t.Helper()
	lg := logger()
	if logs != nil {
		lg = logs.logger()
	}
	if _, err := trustCA.WriteCA(trustCA.dir); err != nil {
		t.Fatal(err)
	}
	regs := make([]*prometheus.Registry, n)
	g := edgetest.StartGroup(t, edgetest.GroupOptions{
		Options: clustertest.Options{N: n, ID: func(i int) string { return fmt.Sprintf("edge-%d", i+1) }},
		Config: func(_ int, m clustertest.Member) edge.Config {
			f := certCA.files(t, m.ID, pki.RoleEdge)
			f.CA = filepath.Join(trustCA.dir, "ca.pem")
			cfg := edge.DefaultConfig()
			cfg.Model = "test-model"
			cfg.Port = 0
			cfg.InternalRequestAuthKey = secureKey
			cfg.AdminToken = "reliability-admin-token-0123456789"
			cfg.DebugRouteHeader = true
			cfg.ContextServers.URLs = []edge.StaticInstance{{Name: workers[telemetry.FleetContext].InstanceID(), URL: workers[telemetry.FleetContext].URL()}}
			cfg.GenerationServers.URLs = []edge.StaticInstance{{Name: workers[telemetry.FleetGeneration].InstanceID(), URL: workers[telemetry.FleetGeneration].URL()}}
			cfg.Telemetry.ProbeInterval = 100 * time.Millisecond
			cfg.Cluster.ProposeTimeout = 2 * time.Second
			cfg.Cluster.Raft = cluster.RaftTiming{HeartbeatTimeout: timing.HeartbeatTimeout, ElectionTimeout: timing.ElectionTimeout,
				LeaderLeaseTimeout: timing.LeaderLeaseTimeout, CommitTimeout: timing.CommitTimeout}
			cfg.TLS = edge.TLSConfig{Mode: edge.TLSModeMutual, CAFile: f.CA, CertFile: f.Cert, KeyFile: f.Key}
			if tweak != nil {
				tweak(&cfg)
			}
			return cfg
		},
		Deps: func(i int, m clustertest.Member) edge.Deps {
			regs[i] = prometheus.NewRegistry()
			return edge.Deps{Logger: lg.With("edge", m.ID), Registry: regs[i], Version: "reliability"}
		},
	})
	out := make([]secureEdge, n)
	for i := range n {
		out[i] = secureEdge{e: g.Node(i).Edge, reg: regs[i]}
	}
	return out
}

func waitSecureLeader(t *testing.T, edges []secureEdge) int {
	t.Helper()
	leader := -1
	waitFor(t, 20*time.Second, "a leader among the TLS edges", func() bool {
		for i, se := range edges {
			if se.e.Node().IsLeader() {
				leader = i
				return true
			}
		}
		return false
	})
	return leader
}

// intruder is a would-be cluster member's TLS identity, with the reason it
// must be refused for: alert, the TLS alert the refusing server sends (the
// client sees "remote error: tls: <alert>"); identity, for a certificate
// the CA issued to someone else, the identity it names (the refusal says it
// does not name the node claimed); neither, for plaintext.
type intruder struct {
	name     string
	conf     *tls.Config // nil: plaintext
	alert    string
	logged   string // the refusing node's own words for the alert's cause
	identity string
}

// intruders are every way of holding no valid certificate for node
// "intruder": none at all, no client certificate, a certificate from
// another CA, an expired one, a worker's certificate from the CA, and an
// edge certificate from the CA issued for another node.
func intruders(t *testing.T, ca *secureCA) []intruder {
	rogue := newSecureCA(t, "rogue-ca")
	return []intruder{
		{name: "plaintext"},
		{name: "no client certificate", conf: presenting(ca, nil), alert: "tls: certificate required",
			logged: "client didn't provide a certificate"},
		{name: "certificate from another CA", conf: presenting(ca, rogue.leaf(t, "intruder", pki.IssueOptions{Role: pki.RoleEdge})),
			alert: "tls: unknown certificate authority", logged: "certificate signed by unknown authority"},
		{name: "expired certificate", conf: presenting(ca, ca.leaf(t, "intruder", pki.IssueOptions{Role: pki.RoleEdge,
			NotBefore: time.Now().Add(-3 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})), alert: "tls: expired certificate",
			logged: "certificate has expired"},
		{name: "a worker's certificate", conf: presenting(ca, ca.leaf(t, "intruder", pki.IssueOptions{Role: pki.RoleWorker})),
			identity: "spiffe://tether/worker/intruder"},
		{name: "another edge's certificate", conf: presenting(ca, ca.leaf(t, "edge-2", pki.IssueOptions{Role: pki.RoleEdge})),
			identity: "spiffe://tether/edge/edge-2"},
	}
}

// Log lines naming why a cluster port refused a connection.
var (
	logNotTLS           = []string{"TLS handshake failed", "first record does not look like a TLS handshake"}
	logRaftNoHandshake  = []string{"refused Raft stream", "inter-node handshake refused"}
	logForwardGarbage   = []string{"refused forwarding connection", "inter-node handshake refused"}
	notNamedIntruder    = `does not name node "intruder"`
	reasonWaitForLogged = 5 * time.Second
)

// assertRefusedFor checks that a refusal names its reason: err (what the
// client saw) contains every part of want, or, when the client could not
// see it (the server closed the connection first: EOF, a broken pipe), a
// refusing node logged every part of logWant.
func assertRefusedFor(t *testing.T, what string, err error, logs *logLines, want []string, logWant []string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: not refused", what)
	}
	if len(want) > 0 {
		seen := true
		for _, w := range want {
			seen = seen && strings.Contains(err.Error(), w)
		}
		if seen {
			return
		}
		if len(logWant) == 0 {
			t.Errorf("%s: refused with %q, want the reason %q", what, err, strings.Join(want, " … "))
			return
		}
	}
	waitFor(t, reasonWaitForLogged, fmt.Sprintf("%s (client saw %q): the refusal's reason logged (%s)", what, err, strings.Join(logWant, " … ")), func() bool {
		return logs.find(logWant...) != ""
	})
}

// assertLogged waits until logs hold a line with every one of parts: the
// reason a refusal was logged with.
func assertLogged(t *testing.T, what string, logs *logLines, parts ...string) {
	t.Helper()
	waitFor(t, reasonWaitForLogged, what+": the refusal's reason logged ("+strings.Join(parts, " … ")+")", func() bool {
		return logs.find(parts...) != ""
	})
}

// forgeAppendTo plays a fake leader against node at addr: an
// AppendEntries with a higher term carrying a Bind of "forged". nil only
// if the node applied it.
func forgeAppendTo(node *cluster.Node, conf *tls.Config) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	tr := raft.NewNetworkTransport(intruderStream{Listener: ln, conf: conf}, 1, 3*time.Second, io.Discard)
	defer tr.Close()
	st := node.Status()
	data, err := fsm.EncodeEntry([]fsm.Proposal{{Event: fsm.Bind{Fleet: fsm.FleetContext, Key: "forged", Instance: "evil"}}})
	if err != nil {
		return err
	}
	term := st.Term + 100
	req := &raft.AppendEntriesRequest{
		RPCHeader:         raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("intruder"), Addr: []byte(ln.Addr().String())},
		Term:              term,
		PrevLogEntry:      st.LastLogIndex,
		PrevLogTerm:       st.Term,
		Entries:           []*raft.Log{{Index: st.LastLogIndex + 1, Term: term, Type: raft.LogCommand, Data: data, AppendedAt: time.Now()}},
		LeaderCommitIndex: st.LastLogIndex + 1,
	}
	var resp raft.AppendEntriesResponse
	if err := tr.AppendEntries(raft.ServerID(node.ID()), raft.ServerAddress(node.Addr()), req, &resp); err != nil {
		return fmt.Errorf("refused at the transport: %w", err)
	}
	if !resp.Success {
		return errors.New("answered but not accepted")
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if _, ok := node.State().Lookup(fsm.FleetContext, "forged"); ok {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return errors.New("accepted but not applied")
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// A 3-edge cluster configured with tls.mode: mutual refuses every node
// without a valid certificate — none, another CA's, expired, or the CA's
// but naming someone else — whether it tries to join (with the right
// cluster key), to append to a follower's log as a fake leader, or to use
// the forwarding port. Membership and state are unchanged afterwards.
func TestSecureClusterRefusesNodesWithoutAValidCertificate(t *testing.T) {
	ca := newSecureCA(t, "tether-reliability-ca")
	workers := map[telemetry.Fleet]*worker.Server{
		telemetry.FleetContext:    startSecureWorker(t, ca, "ctx-1", telemetry.FleetContext),
		telemetry.FleetGeneration: startSecureWorker(t, ca, "gen-1", telemetry.FleetGeneration),
	}
	logs := newLogLines()
	edges := startSecureEdgesLogged(t, ca, ca, 3, workers, nil, logs)
	leader := waitSecureLeader(t, edges)
	follower := edges[(leader+1)%3].e.Node()
	target := edges[leader].e.Node().Addr()
	// A proposal can meet an election on a loaded machine (make test: "no
	// leader known" within the 2 s propose timeout); what is asserted is
	// that members with valid certificates commit, so an unavailable log
	// is asked again until it commits. Any other error fails at once.
	waitfor.Reason(t, 30*time.Second, "a proposal through a follower committed over mutual TLS", func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := edges[(leader+2)%3].e.Node().Propose(ctx, fsm.Bind{Fleet: fsm.FleetContext, Key: "k", Instance: "ctx-1"})
		if errors.Is(err, cluster.ErrUnavailable) {
			return err.Error()
		}
		if err != nil {
			t.Fatalf("propose through a follower over mutual TLS: %v", err)
		}
		return ""
	})
	peersOf := func() string {
		var ids []string
		for _, p := range edges[leader].e.Node().Status().Peers {
			ids = append(ids, p.ID+"@"+p.Addr)
		}
		sort.Strings(ids)
		return strings.Join(ids, ",")
	}
	before := peersOf()

	var wg sync.WaitGroup
	for _, in := range intruders(t, ca) {
		// Joins retry a refused handshake until their deadline: run
		// them side by side.
		wg.Add(1)
		go func() {
			defer wg.Done()
			var want []string
			switch {
			case in.alert != "":
				want = []string{in.alert}
			case in.identity != "":
				// The CA issued it, to someone else: the handshake names
				// whom it does name.
				want = []string{notNamedIntruder, in.identity}
			default:
				// The joiner's plaintext handshake is not a TLS record: the
				// TLS port never answers it.
				want = []string{"handshake: read server hello"}
			}
			// On a loaded machine a handshake can time out before the
			// refusal arrives; that says nothing either way, so try again
			// until the reason is seen (a join that succeeds fails at once).
			deadline := time.Now().Add(30 * time.Second)
			for {
				err := joinAttempt(t, "intruder", target, in.conf, []byte(secureKey))
				if err == nil {
					t.Errorf("join with %s: a node without a valid certificate joined", in.name)
					return
				}
				if containsAll(err.Error(), want) {
					t.Logf("join with %s: refused: %v", in.name, err)
					return
				}
				if time.Now().After(deadline) {
					t.Errorf("join with %s: refused with %q, want the reason %q", in.name, err, strings.Join(want, " … "))
					return
				}
				t.Logf("join with %s: refused without its reason yet (%v); again", in.name, err)
			}
		}()
		t.Run("append with "+in.name, func(t *testing.T) {
			err := forgeAppendTo(follower, in.conf)
			if err == nil {
				t.Fatal("a fake leader without a valid certificate appended to a follower's log")
			}
			t.Logf("refused: %v", err)
			switch {
			case in.alert != "":
				// The raw Raft client writes before it reads: the server's
				// close may reach it as a broken pipe before the alert.
				assertRefusedFor(t, "append", err, logs, []string{in.alert}, []string{"TLS handshake failed", in.logged})
			case in.identity != "":
				// Past TLS (the CA issued it), the raw Raft stream lacks
				// the inter-node handshake that carries the node id; the
				// join above shows the identity check itself.
				assertRefusedFor(t, "append", err, logs, nil, logRaftNoHandshake)
			default:
				assertRefusedFor(t, "append", err, logs, nil, logNotTLS)
			}
		})
		t.Run("forward with "+in.name, func(t *testing.T) {
			conn, err := dialStream(target, in.conf, 'F')
			if err == nil {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
				_, _ = conn.Write([]byte("hello, I am a forwarding client"))
				_, err = io.ReadFull(conn, make([]byte, 64))
			}
			if err == nil {
				t.Fatal("the forwarding port answered a peer without a valid certificate")
			}
			switch {
			case in.alert != "":
				assertRefusedFor(t, "forward", err, logs, []string{in.alert}, nil)
			case in.identity != "":
				assertRefusedFor(t, "forward", err, logs, nil, logForwardGarbage)
			default:
				assertRefusedFor(t, "forward", err, logs, nil, logNotTLS)
			}
		})
	}
	wg.Wait()
	if after := peersOf(); after != before {
		t.Fatalf("membership changed: %s → %s", before, after)
	}
	for i, se := range edges {
		if _, ok := se.e.Node().State().Lookup(fsm.FleetContext, "forged"); ok {
			t.Fatalf("edge-%d applied a forged binding", i+1)
		}
	}
	waitFor(t, 10*time.Second, "every edge to see the binding of k", func() bool {
		for _, se := range edges {
			if b, ok := se.e.Node().State().Lookup(fsm.FleetContext, "k"); !ok || b.Instance != "ctx-1" {
				return false
			}
		}
		return true
	})
}

// Workers with client_auth: require answer only certificates that chain
// to the CA and name an edge. Directly, nothing else gets an HTTP answer;
// through an edge whose own certificate comes from another CA, every hop
// fails (the client gets a 5xx, the worker saw nothing), while an edge
// with a valid certificate routes over TLS end to end.
func TestWorkerRefusesClientsWithoutAValidCertificate(t *testing.T) {
	ca := newSecureCA(t, "tether-reliability-ca")
	ctxLogs := newLogLines()
	ctxW := startSecureWorkerLogged(t, ca, "ctx-1", telemetry.FleetContext, ctxLogs)
	genW := startSecureWorker(t, ca, "gen-1", telemetry.FleetGeneration)
	workers := map[telemetry.Fleet]*worker.Server{telemetry.FleetContext: ctxW, telemetry.FleetGeneration: genW}

	body := chat("hello over TLS")
	for _, in := range intruders(t, ca) {
		if in.conf == nil || in.name == "another edge's certificate" {
			continue // plaintext: below; any edge may call a worker
		}
		resp, err := tlsHTTPClient(t, in.conf).Post(ctxW.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err == nil {
			resp.Body.Close()
			t.Errorf("%s: the worker answered %d", in.name, resp.StatusCode)
			continue
		}
		switch {
		case in.alert != "":
			assertRefusedFor(t, "worker, "+in.name, err, ctxLogs, []string{in.alert}, []string{"TLS handshake error", in.logged})
		default:
			// The CA issued it, but not to an edge: the generic alert
			// reaches the client, the worker logs which names it saw.
			assertRefusedFor(t, "worker, "+in.name, err, ctxLogs, []string{"tls: bad certificate"}, nil)
			assertLogged(t, "worker, "+in.name, ctxLogs, "TLS handshake error", "matches none of [spiffe://tether/edge/*]", in.identity)
		}
	}
	resp, err := httpClient(t).Post(strings.Replace(ctxW.URL(), "https://", "http://", 1)+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	pb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(pb), "HTTP request to an HTTPS server") {
		t.Errorf("plaintext to the worker's TLS port: %d %s, want the TLS server's 400 naming HTTPS", resp.StatusCode, pb)
	}
	edgeCert := presenting(ca, ca.leaf(t, "edge-9", pki.IssueOptions{Role: pki.RoleEdge}))
	resp, err = tlsHTTPClient(t, edgeCert).Post(ctxW.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("an edge's certificate: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("an edge's certificate: %d", resp.StatusCode)
	}

	// Through edges: a valid one routes; one whose certificate comes from
	// another CA (trusting ours) is refused by the workers on every hop.
	rogueCA := newSecureCA(t, "rogue-ca")
	good := startSecureEdges(t, ca, ca, 1, workers, nil)[0]
	rogue := startSecureEdges(t, ca, rogueCA, 1, workers, func(c *edge.Config) { c.MaxRetries = 0 })[0]
	waitFor(t, 20*time.Second, "both edges to lead their one-node clusters", func() bool {
		return good.e.Node().IsLeader() && rogue.e.Node().IsLeader()
	})
	// The valid edge's first probes of the static workers must have
	// answered (a loaded machine may not have run them yet).
	waitFor(t, 20*time.Second, "the valid edge to see both workers healthy", func() bool {
		n := 0
		for _, in := range good.e.Fleet().Instances(time.Now()) {
			if in.Healthy {
				n++
			}
		}
		return n == 2
	})
	// The client trusts both edges' listeners (the rogue edge serves its
	// own CA's certificate).
	both := presenting(ca, nil)
	both.RootCAs.AddCert(rogueCA.Cert)
	goodClient := tlsHTTPClient(t, both)
	served := func(se secureEdge) (int, string) {
		resp, err := goodClient.Post(se.e.URL()+"/v1/chat/completions", "application/json", bytes.NewReader([]byte(body)))
		if err != nil {
			t.Fatalf("client to edge: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get(edge.HeaderRoute) + " " + string(b)
	}
	// A probe that timed out on a loaded machine can mark a worker
	// unhealthy for a moment (503 no_healthy_instance); the valid edge must
	// get through, so ask until it does. Any other answer fails at once.
	waitfor.Reason(t, 20*time.Second, "the valid edge served over TLS", func() string {
		st, b := served(good)
		if st == http.StatusServiceUnavailable && strings.Contains(b, "no_healthy_instance") {
			return b
		}
		if st != http.StatusOK || !strings.Contains(b, "context=ctx-1") {
			t.Fatalf("valid edge over TLS: %d %s", st, b)
		}
		return ""
	})
	scraper := tlsHTTPClient(t, edgeCert)
	before := scrapeSum(t, scraper, ctxW.URL(), "tether_worker_requests_total")
	st, b := served(rogue)
	if st != http.StatusServiceUnavailable || !strings.Contains(b, `"code":"no_healthy_instance"`) {
		t.Fatalf("edge with another CA's certificate: %d %s, want 503 no_healthy_instance (the workers refuse its probes and hops)", st, b)
	}
	// The worker names the cause: the rogue edge's certificate does not
	// chain to the CA.
	assertLogged(t, "rogue edge's hops", ctxLogs, "TLS handshake error", "certificate signed by unknown authority")
	t.Logf("edge with another CA's certificate: %d %s", st, b)
	if after := scrapeSum(t, scraper, ctxW.URL(), "tether_worker_requests_total"); after != before {
		t.Fatalf("the worker served %v requests from an edge without a valid certificate", after-before)
	}
}

// scrapeSum adds every sample of metric name on base's /metrics, except the
// scrapes' own (endpoint="metrics").
func scrapeSum(t *testing.T, c *http.Client, base, name string) float64 {
	t.Helper()
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	total := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name+"{") || strings.Contains(line, `endpoint="metrics"`) {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &v); err == nil {
			total += v
		}
	}
	return total
}

// counterSum adds every series of a counter family in reg.
func counterSum(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			total += counterValue(m)
		}
	}
	return total
}

func counterValue(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return 0
}

// adminRoutes lists the admin API's paths as edge/admin/admin.go dispatches them
// (path == "/x" and strings.HasPrefix(path, "/x/")), so a new endpoint
// cannot be missed by the authentication check below.
func adminRoutes(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "..", "edge", "admin", "admin.go"))
	if err != nil {
		t.Fatal(err)
	}
	var routes []string
	for _, m := range regexp.MustCompile(`path == "(/[^"]*)"`).FindAllStringSubmatch(string(src), -1) {
		routes = append(routes, m[1])
	}
	for _, m := range regexp.MustCompile(`strings\.HasPrefix\(path, "(/[^"]*)"\)`).FindAllStringSubmatch(string(src), -1) {
		// A parameterized route: a concrete key, and its sub-resources.
		routes = append(routes, m[1]+"context/k", m[1]+"context/k/history")
	}
	if len(routes) < 8 {
		t.Fatalf("found only %d admin routes in edge/admin/admin.go: %v (did the dispatch change shape?)", len(routes), routes)
	}
	return routes
}

// Over the edges' HTTPS listener, every admin route of edge/admin/admin.go,
// read or write, answers 401 authentication_error without the admin
// token, with a wrong one, or with only a client certificate from the CA;
// the token opens it.
func TestAdminAPIOverTLSRefusesEveryRouteWithoutTheToken(t *testing.T) {
	ca := newSecureCA(t, "tether-reliability-ca")
	workers := map[telemetry.Fleet]*worker.Server{
		telemetry.FleetContext:    startSecureWorker(t, ca, "ctx-1", telemetry.FleetContext),
		telemetry.FleetGeneration: startSecureWorker(t, ca, "gen-1", telemetry.FleetGeneration),
	}
	se := startSecureEdges(t, ca, ca, 1, workers, nil)[0]
	waitFor(t, 20*time.Second, "the edge to lead", se.e.Node().IsLeader)
	if !strings.HasPrefix(se.e.URL(), "https://") {
		t.Fatalf("edge URL %s", se.e.URL())
	}
	token := "reliability-admin-token-0123456789"
	clients := map[string]*http.Client{
		"CA only":                      tlsHTTPClient(t, presenting(ca, nil)),
		"an edge's client certificate": tlsHTTPClient(t, presenting(ca, ca.leaf(t, "edge-7", pki.IssueOptions{Role: pki.RoleEdge}))),
	}
	auths := map[string]string{"no token": "", "wrong token": "Bearer wrong-admin-token-0123456789", "internal key": "Bearer " + secureKey}
	index0 := se.e.Node().Status().CommitIndex
	routes := adminRoutes(t)
	t.Logf("admin routes from edge/admin/admin.go: %v", routes)
	for _, route := range routes {
		for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
			for cname, c := range clients {
				for aname, auth := range auths {
					req, _ := http.NewRequest(method, se.e.URL()+"/admin/v1"+route, strings.NewReader(`{"id":"edge-9","addr":"127.0.0.1:1"}`))
					if auth != "" {
						req.Header.Set("Authorization", auth)
					}
					resp, err := c.Do(req)
					if err != nil {
						t.Fatalf("%s %s (%s, %s): %v", method, route, cname, aname, err)
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					// The reason, not only a refusal: the OpenAI-shaped
					// error says which credential is missing.
					if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), `"type":"authentication_error"`) ||
						!strings.Contains(string(b), `"code":"unauthorized"`) || !strings.Contains(string(b), "the admin API needs Authorization: Bearer") {
						t.Fatalf("%s %s (%s, %s): %d %s", method, route, cname, aname, resp.StatusCode, b)
					}
				}
			}
		}
	}
	if peers := se.e.Node().Status().Peers; len(peers) != 1 {
		t.Fatalf("unauthenticated admin calls changed the membership: %+v", peers)
	}
	if idx := se.e.Node().Status().CommitIndex; idx < index0 {
		t.Fatalf("commit index went back from %d to %d (a restore?)", index0, idx)
	}
	// The token opens it (the routes are real).
	req, _ := http.NewRequest(http.MethodGet, se.e.URL()+"/admin/v1/cluster", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := clients["CA only"].Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("with the token: %d", resp.StatusCode)
	}
	// And plaintext HTTP never reaches the admin API of a TLS edge.
	resp, err = httpClient(t).Get("http://" + se.e.Addr() + "/admin/v1/cluster")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "HTTP request to an HTTPS server") {
		t.Fatalf("plaintext to the TLS listener: %d %s, want the TLS server's 400 naming HTTPS", resp.StatusCode, b)
	}
}

// The edge's embedded NATS server with mutual TLS authorizes by the
// certificate's identity: a worker process holding ctx-1's certificate but
// claiming to be ctx-2 never registers (the server refuses its publishes),
// a raw publish on another instance's subject is a permissions violation,
// and a payload naming another instance on the worker's own subject is
// dropped by the edge's decoder.
func TestEmbeddedNATSBindsTelemetryToTheCertificate(t *testing.T) {
	ca := newSecureCA(t, "tether-reliability-ca")
	ef := ca.files(t, "edge-1", pki.RoleEdge)
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := edge.DefaultConfig()
	cfg.Model = "test-model"
	cfg.Port = 0
	cfg.InternalRequestAuthKey = secureKey
	cfg.NATS = edge.NATSConfig{Embedded: true, Listen: "127.0.0.1:0"}
	cfg.TLS = edge.TLSConfig{Mode: edge.TLSModeMutual, CAFile: ef.CA, CertFile: ef.Cert, KeyFile: ef.Key}
	cfg.Cluster = edge.ClusterConfig{
		Settings: cluster.Settings{NodeID: "edge-1", DataDir: filepath.Join(dir, "edge-1"), Bootstrap: true, Peers: []cluster.Peer{{ID: "edge-1", Addr: ln.Addr().String()}}, Raft: cluster.RaftTiming{HeartbeatTimeout: timing.HeartbeatTimeout,
			ElectionTimeout: timing.ElectionTimeout, LeaderLeaseTimeout: timing.LeaderLeaseTimeout, CommitTimeout: timing.CommitTimeout}},
	}
	reg := prometheus.NewRegistry()
	e, err := edge.New(cfg, edge.Deps{Logger: logger(), Registry: reg, ClusterListener: ln})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		if err := e.Close(cctx); err != nil {
			t.Errorf("close edge: %v", err)
		}
	})

	// ctx-1 honest; an impersonator runs as ctx-2 with ctx-1's certificate.
	ctx1 := ca.files(t, "ctx-1", pki.RoleWorker)
	start := func(id string, f pki.Files) {
		wc := worker.DefaultConfig()
		wc.InstanceID, wc.Model, wc.InternalRequestAuthKey = id, "test-model", secureKey
		wc.Engine.TimeScale = 0
		wc.TelemetryInterval = 20 * time.Millisecond
		wc.Logger = logger()
		wc.TLS = worker.ServerTLSConfig{Mode: worker.TLSModeMutual, CAFile: f.CA, CertFile: f.Cert, KeyFile: f.Key}
		wc.NATS.URLs = []string{e.NATSURL()}
		wc.NATS.TLS = worker.TLSConfig{CAFile: f.CA, CertFile: f.Cert, KeyFile: f.Key}
		workertest.Start(t, worker.New, wc)
	}
	start("ctx-1", ctx1)
	start("ctx-2", ctx1)
	received := func() float64 { return counterSum(t, reg, "tether_edge_telemetry_messages_total") }
	waitFor(t, 20*time.Second, "ctx-1 registered and 20 telemetry messages", func() bool {
		_, ok := e.Fleet().Instance("ctx-1", time.Now())
		return ok && received() >= 20
	})
	if _, ok := e.Fleet().Instance("ctx-2", time.Now()); ok {
		t.Fatal("the edge registered ctx-2 from a process holding ctx-1's certificate")
	}

	// A raw client with ctx-1's certificate: another instance's subject is
	// a permissions violation.
	errs := make(chan error, 8)
	nc, err := nats.Connect(e.NATSURL(), nats.RootCAs(ctx1.CA), nats.ClientCert(ctx1.Cert, ctx1.Key),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	report := telemetry.LoadReport{Instance: "ctx-2", Fleet: telemetry.FleetContext, URL: "https://127.0.0.1:1", Model: "test-model",
		BootID: 7, Seq: 1, IntervalMilli: 20, BlockSize: 64, FeatureLevel: telemetry.FeatureLevel, Ranks: []telemetry.RankLoad{{Rank: 0, KVBlocksTotal: 1}}}
	payload, err := telemetry.EncodeLoad(report)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(telemetry.LoadSubject(telemetry.FleetContext, "ctx-2"), payload); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) && !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("publish on ctx-2's subject with ctx-1's certificate: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no permissions violation for a publish on another instance's subject")
	}

	// ctx-2's report on ctx-1's own subject: delivered, and dropped by the
	// edge's decoder as a subject mismatch.
	mismatch := func() float64 {
		mfs, _ := reg.Gather()
		total := 0.0
		for _, mf := range mfs {
			if mf.GetName() != "tether_edge_telemetry_dropped_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "reason" && l.GetValue() == "subject_mismatch" {
						total += counterValue(m)
					}
				}
			}
		}
		return total
	}
	before := mismatch()
	if err := nc.Publish(telemetry.LoadSubject(telemetry.FleetContext, "ctx-1"), payload); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	waitFor(t, 10*time.Second, "the edge to drop the mismatched report", func() bool { return mismatch() > before })
	if _, ok := e.Fleet().Instance("ctx-2", time.Now()); ok {
		t.Fatal("the edge registered ctx-2 from a report on ctx-1's subject")
	}
}
