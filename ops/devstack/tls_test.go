package devstack

import (
	"context"
	"crypto/tls"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/cluster/pki"
	"github.com/tether-project/tether/internal/telemetry"
)

// A MutualTLS stack: HTTPS edges whose certificates chain to CAFile,
// workers that answer only edges, and a NATS server that takes only
// certificates from the CA and lets a worker certificate publish only its
// own telemetry.
func TestMutualTLSStack(t *testing.T) {
	st := startStack(t, Options{Edges: 1, ContextWorkers: 1, GenerationWorkers: 1, Ranks: 1, MutualTLS: true})
	if !st.MutualTLS() || st.CAFile() == "" || !strings.HasPrefix(st.Edges()[0].URL(), "https://") || !strings.HasPrefix(st.NATSURL(), "tls://") {
		t.Fatalf("mutual TLS stack: CA %q, edge %s, nats %s", st.CAFile(), st.Edges()[0].URL(), st.NATSURL())
	}
	c := stackClient(t, st)
	chat(t, c, st, st.Edges()[0], "s1", "", "hello")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := st.Edges()[0].Cluster(ctx); err != nil {
		t.Fatalf("admin over TLS: %v", err)
	}
	// A client that does not trust the CA fails the handshake.
	if _, err := httpClient(t).Get(st.Edges()[0].URL() + "/healthz"); err == nil {
		t.Fatal("a client without the CA reached an edge")
	}
	// Workers serve their API to edges only; health and metrics stay
	// open to a developer without a certificate.
	w := st.Workers()[0]
	if !strings.HasPrefix(w.URL(), "https://") {
		t.Fatalf("worker URL %s", w.URL())
	}
	for path, want := range map[string]int{"/healthz": http.StatusOK, "/metrics": http.StatusOK, "/v1/models": http.StatusUnauthorized} {
		resp, err := c.Get(w.URL() + path)
		if err != nil {
			t.Fatalf("worker %s: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("worker %s without a client certificate: %d, want %d", path, resp.StatusCode, want)
		}
	}

	// NATS: no certificate → refused; a worker certificate → its own
	// subjects only.
	f, ok := st.CertFiles("ctx-1")
	if !ok {
		t.Fatal("no certificate files for ctx-1")
	}
	if nc, err := nats.Connect(st.NATSURL(), nats.RootCAs(f.CA), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("NATS accepted a client without a certificate")
	}
	errs := make(chan error, 4)
	nc, err := nats.Connect(st.NATSURL(), nats.RootCAs(f.CA), nats.ClientCert(f.Cert, f.Key),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Publish(telemetry.LoadSubject(telemetry.FleetGeneration, "gen-1"), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case err := <-errs:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("publish as ctx-1 for gen-1: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no permissions violation for ctx-1 publishing gen-1's load")
	}
	// Every node's certificate carries its identity.
	for id, role := range map[string]pki.Role{"edge-1": pki.RoleEdge, "gen-1": pki.RoleWorker, "nats": pki.RoleNATS} {
		f, ok := st.CertFiles(id)
		if !ok {
			t.Fatalf("no files for %s", id)
		}
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := pki.IdentityOf(pair.Leaf); !ok || got != (pki.Identity{Role: role, ID: id}) {
			t.Fatalf("%s: identity %v %v", id, got, ok)
		}
	}
}
