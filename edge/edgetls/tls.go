// Package edgetls is the transport security of an edge's links, loaded
// once from the tls section (one CA, one identity): the cluster port's,
// the HTTP listener's, the hops' and probes' to workers, the NATS client's
// and the embedded NATS server's TLS; the startup warnings about what runs
// unprotected; the hop guard, which refuses plaintext hops under mutual TLS
// and sends a discovered worker's requests only over a connection whose
// certificate names that worker (pooled per instance); and the embedded NATS
// server's accounts. See edge/DESIGN.md "Transport security".
package edgetls

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/cluster/pki"
	"github.com/tether-project/tether/edge/config"
)

// TLS is the edge's loaded transport security. Every *tls.Config is nil in
// plaintext mode.
type TLS struct {
	cfg    config.TLSConfig
	bundle *pki.Bundle
	// Cluster is cluster.Config.TLS: mutual, TLS 1.3, both directions.
	Cluster *tls.Config
	// HTTP is the HTTP listener's server configuration.
	HTTP *tls.Config
	// Worker is the client configuration of hops and probes to workers.
	Worker *tls.Config
	// natsClient is the edge's NATS connection's configuration; natsServer
	// the embedded server's.
	natsClient *tls.Config
	natsServer *tls.Config
}

// Load reads the certificate files named by cfg (errors name the key).
func Load(cfg *config.Config) (*TLS, error) {
	t := &TLS{cfg: cfg.TLS}
	if cfg.TLS.Mutual() {
		b, err := pki.Load(pki.Source{CAFile: cfg.TLS.CAFile, CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile})
		if err != nil {
			return nil, fmt.Errorf("tls.%w", err)
		}
		t.bundle = b
		t.Cluster = b.MutualConfig()
		if cfg.TLS.HTTPTLS() {
			auth := tls.NoClientCert
			if cfg.TLS.HTTPClientAuth == config.ClientAuthRequire {
				auth = tls.RequireAndVerifyClientCert
			}
			t.HTTP = b.ServerConfig(auth)
			t.HTTP.NextProtos = []string{"http/1.1"}
		}
		t.Worker = b.ClientConfig(cfg.TLS.WorkerServerName)
		if cfg.NATS.Embedded {
			t.natsServer = b.ServerConfig(tls.RequireAndVerifyClientCert)
			// The edge dials its own server: verify it against a name
			// its certificate carries.
			t.natsClient = b.ClientConfig(selfName(b.KeyPair.Leaf()))
		}
	}
	if nt := cfg.NATS.TLS; nt.Set() {
		c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: nt.ServerName}
		if nt.CAFile != "" {
			pool, err := pki.LoadPool(nt.CAFile)
			if err != nil {
				return nil, fmt.Errorf("nats.tls.ca_file: %w", err)
			}
			c.RootCAs = pool
		}
		if nt.CertFile != "" {
			kp, err := pki.LoadKeyPair(nt.CertFile, nt.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("nats.tls.%w", err)
			}
			c.GetClientCertificate = kp.GetClientCertificate
		}
		t.natsClient = c
	}
	return t, nil
}

// selfName is a name cert is valid for, to verify a connection to oneself.
func selfName(cert *x509.Certificate) string {
	if len(cert.DNSNames) > 0 {
		return cert.DNSNames[0]
	}
	if len(cert.IPAddresses) > 0 {
		return cert.IPAddresses[0].String()
	}
	return cert.Subject.CommonName
}

// Warnings are the startup warnings about what runs unprotected.
func (t *TLS) Warnings(cfg *config.Config) []string {
	var w []string
	switch {
	case cfg.TLS.Mode == "":
		w = append(w, "no tls section: the cluster port, the HTTP API (admin token included), worker hops and NATS run PLAINTEXT; set tls.mode: mutual (or tls.mode: plaintext to say so explicitly)")
	case cfg.TLS.Mode == config.TLSModePlaintext:
		w = append(w, "tls.mode is plaintext: the cluster port, the HTTP API (admin token included), worker hops and NATS are unencrypted and peers are not authenticated by certificate")
	case !cfg.TLS.HTTPTLS():
		w = append(w, "tls.http is plaintext: the public and admin API (and the admin token) are unencrypted on this listener; keep it reachable only from the TLS-terminating gateway")
	}
	if cfg.TLS.Mutual() && len(cfg.NATS.URLs) > 0 && !cfg.NATS.TLS.Set() {
		w = append(w, "nats.urls without nats.tls: worker telemetry reaches this edge unencrypted and the NATS server is not authenticated")
	}
	if cfg.NATS.Embedded && !cfg.TLS.Mutual() && len(cfg.NATS.WorkerUsers) == 0 {
		w = append(w, "embedded NATS without TLS or nats.worker_users: any client that reaches nats.listen (with nats.user's password, if set) can publish telemetry for any instance")
	}
	return w
}

// Scheme is the HTTP listener's URL scheme.
func (t *TLS) Scheme() string {
	if t.HTTP == nil {
		return "http"
	}
	return "https"
}

// GuardHops refuses plaintext hops in mutual mode: a worker that
// registered an http:// URL over telemetry is not sent prompts and signed
// hints in the clear. The hop fails like an unreachable instance (retried
// elsewhere, the breaker counts it) and the edge logs it once per host.
// With a certificate per worker, hops also go only to a server proving
// the instance's identity (workerident.go).
func (t *TLS) GuardHops(rt http.RoundTripper, log *slog.Logger, reg prometheus.Registerer) http.RoundTripper {
	if !t.cfg.Mutual() {
		return rt
	}
	if t.cfg.ChecksWorkerIdentity() {
		rt = newIdentityGuard(rt, reg)
	}
	return &hopGuard{next: rt, log: log}
}

type hopGuard struct {
	next   http.RoundTripper
	log    *slog.Logger
	warned sync.Map // host → struct{}
}

func (g *hopGuard) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme != "https" {
		if _, done := g.warned.LoadOrStore(r.URL.Host, struct{}{}); !done {
			g.log.Warn("refusing plaintext hops to a worker: tls.mode is mutual and the worker's URL is not https", "url", r.URL.Scheme+"://"+r.URL.Host)
		}
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, fmt.Errorf("edge: refusing a plaintext hop to %s: tls.mode is mutual (the worker must serve https)", r.URL.Host)
	}
	return g.next.RoundTrip(r)
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the
// wrapped transport.
func (g *hopGuard) CloseIdleConnections() {
	if c, ok := g.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// NATSClientOptions are the TLS and credential options of the edge's NATS
// connection.
func (t *TLS) NATSClientOptions() []nats.Option {
	if t.natsClient == nil {
		return nil
	}
	return []nats.Option{nats.Secure(t.natsClient)}
}
