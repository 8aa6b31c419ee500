package edgetls

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tether-project/tether/cluster/pki"
	"github.com/tether-project/tether/edge/fleetview"
)

// A hop that expects a worker's identity is sent only over a connection
// whose server certificate names that worker: a server presenting another
// worker's (valid) certificate receives nothing, and a connection verified
// for one worker never carries another's request.
func TestHopsReachOnlyTheExpectedWorker(t *testing.T) {
	ca, err := pki.NewCA("test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue("ctx-2", pki.IssueOptions{Role: pki.RoleWorker, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	var served atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		w.WriteHeader(200)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf.TLS}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	defer srv.Close()

	base := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}}
	reg := prometheus.NewRegistry()
	g := newIdentityGuard(base, reg)
	defer g.CloseIdleConnections()
	c := &http.Client{Transport: g}
	get := func(expect string) error {
		ctx := context.Background()
		if expect != "" {
			ctx = fleetview.ExpectWorker(ctx, expect)
		}
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/chat/completions", strings.NewReader(`{"prompt":"secret"}`))
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}

	if err := get("ctx-2"); err != nil {
		t.Fatalf("a hop to ctx-2 at ctx-2's server: %v", err)
	}
	before := served.Load()
	err = get("ctx-1")
	var wrong *errWrongWorker
	if !errors.As(err, &wrong) {
		t.Fatalf("a hop to ctx-1 at ctx-2's server: err %v, want the identity refused", err)
	}
	if served.Load() != before {
		t.Error("the server presenting ctx-2's certificate received ctx-1's request")
	}
	var m dto.Metric
	if err := g.refused.Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 1 {
		t.Errorf("refusals counted %v, want 1", got)
	}
	// Static instances (no expectation) keep ordinary verification.
	if err := get(""); err != nil {
		t.Errorf("a hop without an expectation: %v", err)
	}
}
