package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/cluster/pki"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/testhttp"
	"github.com/tether-project/tether/worker"
)

// testPKI is a CA with its certificate files in a temporary directory.
type testPKI struct {
	ca  *pki.CA
	dir string
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	ca, err := pki.NewCA("edge-test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{ca: ca, dir: t.TempDir()}
}

// files issues id's certificate in role and writes it.
func (p *testPKI) files(t testing.TB, id string, role pki.Role) pki.Files {
	t.Helper()
	leaf, err := p.ca.Issue(id, pki.IssueOptions{Role: role})
	if err != nil {
		t.Fatal(err)
	}
	f, err := p.ca.WriteFiles(p.dir, id, leaf)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// client trusts the CA and presents no certificate.
func (p *testPKI) client(t testing.TB) *http.Client {
	return testhttp.Client(t, &tls.Config{RootCAs: p.ca.Pool(), MinVersion: tls.VersionTLS12})
}

// startTLSWorker runs a worker of fleet that serves mutual TLS (edges only)
// and publishes telemetry to natsURL with its certificate.
func startTLSWorker(t *testing.T, p *testPKI, id string, fleet telemetry.Fleet, natsURL string) *worker.Server {
	t.Helper()
	f := p.files(t, id, pki.RoleWorker)
	cfg := worker.DefaultConfig()
	cfg.InstanceID = id
	cfg.Model = testModel
	cfg.InternalRequestAuthKey = testKey
	cfg.Fleet = fleet
	cfg.Engine.TimeScale = 0
	cfg.Engine.BlockSize = testBlockSize
	cfg.TelemetryInterval = 50 * time.Millisecond
	cfg.Logger = testLogger(t)
	cfg.TLS = worker.ServerTLSConfig{Mode: worker.TLSModeMutual, CAFile: f.CA, CertFile: f.Cert, KeyFile: f.Key,
		AllowedClients: []string{pki.IdentityURI(pki.RoleEdge, "*")}}
	cfg.NATS.URLs = []string{natsURL}
	cfg.NATS.TLS = worker.TLSConfig{CAFile: f.CA, CertFile: f.Cert, KeyFile: f.Key}
	srv, err := worker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	return srv
}

// One edge in mutual mode with its embedded NATS server: HTTPS on its
// listener, workers register over TLS with their certificates, hops go
// over TLS, and a certificate speaks only for its own instance.
func TestMutualTLSEdgeEndToEnd(t *testing.T) {
	p := newTestPKI(t)
	ef := p.files(t, "edge-1", pki.RoleEdge)
	ec := startEdges(t, 1, "", func(_ int, c *Config) {
		c.NATS = NATSConfig{Embedded: true, Listen: "127.0.0.1:0"}
		c.TLS = TLSConfig{Mode: TLSModeMutual, CAFile: ef.CA, CertFile: ef.Cert, KeyFile: ef.Key}
	})
	e := ec.edge(0).e
	if !strings.HasPrefix(e.URL(), "https://") || !strings.HasPrefix(e.NATSURL(), "tls://") {
		t.Fatalf("edge URL %s, NATS URL %s: want https and tls", e.URL(), e.NATSURL())
	}
	ctxW := startTLSWorker(t, p, "ctx-1", telemetry.FleetContext, e.NATSURL())
	startTLSWorker(t, p, "gen-1", telemetry.FleetGeneration, e.NATSURL())
	if !strings.HasPrefix(ctxW.URL(), "https://") {
		t.Fatalf("worker advertises %s, want https", ctxW.URL())
	}
	ec.waitInstances(2)

	c := p.client(t)
	r := do(t, c, http.MethodPost, e.URL()+"/v1/chat/completions", chatBody(t, longText("sys", 40), []string{"hello"}, nil), map[string]string{"x-session-id": "s1"})
	if r.status != http.StatusOK {
		t.Fatalf("chat over TLS: %d %s", r.status, r.body)
	}
	if ci, gi := routeOf(t, r); ci != "ctx-1" || gi != "gen-1" {
		t.Fatalf("route %s / %s", ci, gi)
	}
	// Plain HTTP on the HTTPS port is refused by the TLS server.
	if r := do(t, httpClient(t), http.MethodGet, "http://"+e.Addr()+"/healthz", nil, nil); r.status != http.StatusBadRequest {
		t.Fatalf("plain HTTP on the TLS listener: %d %s", r.status, r.body)
	}
	// The worker refuses a client without a certificate (the handshake
	// fails), so nobody but an edge reaches it.
	if _, err := c.Get(ctxW.URL() + "/healthz"); err == nil {
		t.Fatal("a worker requiring client certificates answered a client without one")
	}

	// NATS: a worker certificate publishes only for its own instance.
	rogue := p.files(t, "ctx-9", pki.RoleWorker)
	errs := make(chan error, 8)
	nc, err := nats.Connect(e.NATSURL(), nats.ClientCert(rogue.Cert, rogue.Key), nats.RootCAs(rogue.CA),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Publish(telemetry.LoadSubject(telemetry.FleetContext, "ctx-1"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) && !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("publish for another instance: %v, want a permissions violation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no permissions violation for a publish on another instance's subject")
	}
	// Without a client certificate the embedded server refuses the
	// connection.
	if nc2, err := nats.Connect(e.NATSURL(), nats.RootCAs(ef.CA), nats.MaxReconnects(0)); err == nil {
		nc2.Close()
		t.Fatal("the embedded NATS server accepted a client without a certificate")
	}
}
