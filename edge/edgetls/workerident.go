package edgetls

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/cluster/pki"
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/fleetview"
)

// Worker identity on hops. With mutual TLS (and no shared worker
// certificate, tls.worker_server_name), a request to a worker that
// registered through telemetry carries the instance it is for
// (fleetview.ExpectWorker), and is sent only over a connection whose
// server certificate names that instance: URI SAN
// spiffe://tether/worker/<instance>, checked in the handshake, after the
// usual chain and host checks, before a byte of the request is written.
// Connections are pooled per instance, so a connection verified for one
// instance never carries another's request even when two instances claim
// the same address. Requests without an expectation (static instances,
// whose URLs are configuration) use the plain transport.

// maxIdentityPools bounds the per-instance connection pools kept; beyond
// it, idle pools are closed and dropped before a new one is added.
const maxIdentityPools = 4096

// identityGuard is the hop transport that enforces the expectation.
type identityGuard struct {
	base    *http.Transport   // cloned per identity
	other   http.RoundTripper // a non-*http.Transport: checked after the exchange
	refused prometheus.Counter

	mu    sync.Mutex
	pools map[string]*http.Transport
}

func newIdentityGuard(rt http.RoundTripper, reg prometheus.Registerer) *identityGuard {
	g := &identityGuard{pools: make(map[string]*http.Transport)}
	if t, ok := rt.(*http.Transport); ok {
		g.base = t
	} else {
		g.other = rt
	}
	g.refused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tether_edge_worker_identity_refused_total",
		Help: "Connections to a worker refused because its certificate did not name the instance the edge dialed (spiffe://tether/worker/<instance>).",
	})
	if reg != nil {
		if err := reg.Register(g.refused); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				g.refused = are.ExistingCollector.(prometheus.Counter)
			}
		}
	}
	return g
}

// errWrongWorker is a server certificate naming another identity.
type errWrongWorker struct{ want, got string }

func (e *errWrongWorker) Error() string {
	return fmt.Sprintf("worker certificate names %s, not %s: refusing to send it the instance's requests", e.got, e.want)
}

// checkIdentity is the VerifyConnection check for worker id.
func (g *identityGuard) checkIdentity(id string) func(tls.ConnectionState) error {
	want := pki.Identity{Role: pki.RoleWorker, ID: id}
	return func(cs tls.ConnectionState) error {
		got := "no tether identity"
		if len(cs.PeerCertificates) > 0 {
			if idt, ok := pki.IdentityOf(cs.PeerCertificates[0]); ok {
				if idt == want {
					return nil
				}
				got = idt.String()
			}
		}
		g.refused.Inc()
		return &errWrongWorker{want: want.String(), got: got}
	}
}

func (g *identityGuard) pool(id string) *http.Transport {
	g.mu.Lock()
	defer g.mu.Unlock()
	if t, ok := g.pools[id]; ok {
		return t
	}
	if len(g.pools) >= maxIdentityPools {
		for k, t := range g.pools {
			t.CloseIdleConnections()
			delete(g.pools, k)
		}
	}
	t := g.base.Clone()
	if t.TLSClientConfig == nil {
		t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	prev := t.TLSClientConfig.VerifyConnection
	check := g.checkIdentity(id)
	t.TLSClientConfig.VerifyConnection = func(cs tls.ConnectionState) error {
		if prev != nil {
			if err := prev(cs); err != nil {
				return err
			}
		}
		return check(cs)
	}
	g.pools[id] = t
	return t
}

func (g *identityGuard) RoundTrip(r *http.Request) (*http.Response, error) {
	id, ok := fleetview.ExpectedWorker(r.Context())
	switch {
	case !ok && g.base != nil:
		return g.base.RoundTrip(r)
	case !ok:
		return g.other.RoundTrip(r)
	case g.base != nil:
		return g.pool(id).RoundTrip(r)
	}
	// A custom transport: the check can only follow the exchange.
	resp, err := g.other.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	var cs tls.ConnectionState
	if resp.TLS != nil {
		cs = *resp.TLS
	}
	if err := g.checkIdentity(id)(cs); err != nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, err
	}
	return resp, nil
}

// CloseIdleConnections closes every pool's idle connections.
func (g *identityGuard) CloseIdleConnections() {
	g.mu.Lock()
	pools := make([]*http.Transport, 0, len(g.pools))
	for _, t := range g.pools {
		pools = append(pools, t)
	}
	g.mu.Unlock()
	for _, t := range pools {
		t.CloseIdleConnections()
	}
	if g.base != nil {
		g.base.CloseIdleConnections()
	} else if c, ok := g.other.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// verifyWorkerAddress is the fleet view's address check through client (the
// hop client): GET url/healthz with the worker's identity expected (ctx
// carries it). Any HTTP answer proves the identity: the handshake checked it.
func verifyWorkerAddress(ctx context.Context, client *http.Client, workerID, url string) error {
	req, err := http.NewRequestWithContext(fleetview.ExpectWorker(ctx, workerID), http.MethodGet, url+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	return nil
}

// AddressVerifier is the fleet view's VerifyAddress, through the hop
// client: nil unless the edge checks worker identities (cfg).
func AddressVerifier(cfg config.TLSConfig, client *http.Client) func(ctx context.Context, workerID, url string) error {
	if !cfg.ChecksWorkerIdentity() {
		return nil
	}
	return func(ctx context.Context, workerID, url string) error {
		return verifyWorkerAddress(ctx, client, workerID, url)
	}
}
