package edge

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-project/tether/cluster/pki"
)

// Transport security modes (tls.mode).
const (
	// TLSModeMutual: the cluster port, the edge's HTTP listener, the hops
	// to workers and the embedded NATS server run over TLS with
	// certificates from one CA; peers must present one.
	TLSModeMutual = "mutual"
	// TLSModePlaintext: no TLS anywhere (the edge logs a warning). The
	// internal key, the cluster key and the admin token still
	// authenticate, but anyone on the path reads and can replay traffic.
	TLSModePlaintext = "plaintext"
)

// HTTP listener modes (tls.http) and client authentication
// (tls.http_client_auth).
const (
	HTTPListenerTLS       = "tls"
	HTTPListenerPlaintext = "plaintext"
	ClientAuthNone        = "none"
	ClientAuthRequire     = "require"
)

// TLSConfig is the edge's tls section. See docs/security.md.
type TLSConfig struct {
	// Mode is mutual or plaintext. A configuration file without it runs
	// plaintext with a warning (configs written before the section
	// existed keep starting during an upgrade); DefaultConfig says
	// plaintext explicitly.
	Mode string `yaml:"mode"`
	// CAFile verifies every peer (edges, workers, NATS, clients that
	// present certificates); CertFile and KeyFile are this edge's
	// identity, presented on every link. Renewed files are picked up
	// without a restart.
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// HTTP is the edge's own listener (public and admin API): tls (the
	// default in mutual mode) or plaintext, for an edge behind a gateway
	// that terminates TLS on the same host or pod network. The admin
	// token then crosses that network in the clear.
	HTTP string `yaml:"http"`
	// HTTPClientAuth: none (default) or require — clients of the HTTP
	// listener (gateway, operators, probes) must present a certificate
	// from the CA.
	HTTPClientAuth string `yaml:"http_client_auth"`
	// WorkerServerName, when set, is the name workers' certificates must
	// carry instead of their URL's host (workers advertising pod IPs
	// with a shared certificate).
	WorkerServerName string `yaml:"worker_server_name"`
}

// mutual reports whether the edge runs mutual TLS.
func (t TLSConfig) mutual() bool { return t.Mode == TLSModeMutual }

// httpTLS reports whether the HTTP listener serves TLS.
func (t TLSConfig) httpTLS() bool {
	return t.mutual() && (t.HTTP == "" || t.HTTP == HTTPListenerTLS)
}

// NATSTLSConfig is nats.tls: TLS toward an external NATS server.
type NATSTLSConfig struct {
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

func (n NATSTLSConfig) set() bool { return n != NATSTLSConfig{} }

// NATSWorkerUser is one entry of nats.worker_users: a worker's account
// on the embedded NATS server (plaintext mode; with mutual TLS workers are
// identified by their certificates). Its user name is the instance id and
// it may publish only that instance's telemetry.
type NATSWorkerUser struct {
	Instance string `yaml:"instance"`
	Password string `yaml:"password"`
}

// validateTLS checks the tls section and the TLS-dependent parts of the
// others; errors name the key.
func (c *Config) validateTLS(bad func(key, format string, args ...any)) {
	t := c.TLS
	fileKeys := []struct{ key, path string }{{"tls.ca_file", t.CAFile}, {"tls.cert_file", t.CertFile}, {"tls.key_file", t.KeyFile}}
	switch t.Mode {
	case TLSModeMutual:
		// The files are read by New (errors name the key too), not here:
		// a configuration is checked where its certificates are not
		// mounted (CI, an operator's laptop).
		for _, f := range fileKeys {
			if f.path == "" {
				bad(f.key, "required with tls.mode: mutual")
			}
		}
	case "", TLSModePlaintext:
		for _, f := range fileKeys {
			if f.path != "" {
				bad(f.key, "set, but tls.mode is %q: certificates are used only with tls.mode: mutual", t.Mode)
			}
		}
		for _, k := range []struct{ key, v string }{{"tls.http", t.HTTP}, {"tls.http_client_auth", t.HTTPClientAuth}, {"tls.worker_server_name", t.WorkerServerName}} {
			if k.v != "" && !(k.key == "tls.http" && k.v == HTTPListenerPlaintext) && !(k.key == "tls.http_client_auth" && k.v == ClientAuthNone) {
				bad(k.key, "needs tls.mode: mutual")
			}
		}
	default:
		bad("tls.mode", "unknown value %q (allowed: mutual, plaintext)", t.Mode)
	}
	switch t.HTTP {
	case "", HTTPListenerTLS, HTTPListenerPlaintext:
	default:
		bad("tls.http", "unknown value %q (allowed: tls, plaintext)", t.HTTP)
	}
	switch t.HTTPClientAuth {
	case "", ClientAuthNone:
	case ClientAuthRequire:
		if t.HTTP == HTTPListenerPlaintext {
			bad("tls.http_client_auth", "require needs tls.http: tls")
		}
	default:
		bad("tls.http_client_auth", "unknown value %q (allowed: none, require)", t.HTTPClientAuth)
	}
	if t.mutual() {
		// Hops carry prompts and signed hints: no plaintext hop when
		// the edge runs TLS.
		for _, fl := range []struct {
			key string
			s   *ServersConfig
		}{{"context_servers", &c.ContextServers}, {"generation_servers", &c.GenerationServers}} {
			for i, si := range fl.s.URLs {
				if len(si.URL) >= 7 && si.URL[:7] == "http://" {
					bad(fmt.Sprintf("%s.urls[%d]", fl.key, i), "%s is plaintext but tls.mode is mutual: workers are reached over TLS (https://)", si.URL)
				}
			}
		}
	}

	n := c.NATS
	nt := n.TLS
	if nt.set() {
		if !n.Enabled() {
			bad("nats.tls", "set without nats.urls or nats.embedded")
		}
		if n.Embedded {
			bad("nats.tls", "is for an external NATS server; the embedded server uses the tls section's files")
		}
		if (nt.CertFile == "") != (nt.KeyFile == "") {
			bad("nats.tls.cert_file", "cert_file and key_file go together")
		}
	}
	if len(n.WorkerUsers) > 0 {
		switch {
		case !n.Embedded:
			bad("nats.worker_users", "accounts of the embedded NATS server: set nats.embedded")
		case t.mutual():
			bad("nats.worker_users", "not used with tls.mode: mutual (the embedded server identifies workers by their certificates)")
		case n.User == "":
			bad("nats.user", "required with nats.worker_users (the edge's own account; without it the server would accept anyone)")
		}
		seen := map[string]bool{}
		for i, u := range n.WorkerUsers {
			key := fmt.Sprintf("nats.worker_users[%d]", i)
			if !validInstanceName(u.Instance) {
				bad(key+".instance", "%q must be 1..128 characters of [A-Za-z0-9_-] (the worker's instance_id)", u.Instance)
			}
			if seen[u.Instance] || u.Instance == n.User {
				bad(key+".instance", "duplicate user %q", u.Instance)
			}
			seen[u.Instance] = true
			if len(u.Password) < MinSecretLen {
				bad(key+".password", "%d bytes is too short (want at least %d)", len(u.Password), MinSecretLen)
			}
		}
	}
}

// edgeTLS is the edge's loaded transport security. Every *tls.Config is
// nil in plaintext mode.
type edgeTLS struct {
	cfg    TLSConfig
	bundle *pki.Bundle
	// cluster is cluster.Config.TLS: mutual, TLS 1.3, both directions.
	cluster *tls.Config
	// http is the HTTP listener's server configuration.
	http *tls.Config
	// worker is the client configuration of hops and probes to workers.
	worker *tls.Config
	// natsClient is the edge's NATS connection's configuration; natsServer
	// the embedded server's.
	natsClient *tls.Config
	natsServer *tls.Config
}

// loadTLS reads the certificate files named by cfg.
func loadTLS(cfg *Config) (*edgeTLS, error) {
	t := &edgeTLS{cfg: cfg.TLS}
	if cfg.TLS.mutual() {
		b, err := pki.Load(pki.Source{CAFile: cfg.TLS.CAFile, CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile})
		if err != nil {
			return nil, fmt.Errorf("tls.%w", err)
		}
		t.bundle = b
		t.cluster = b.MutualConfig()
		if cfg.TLS.httpTLS() {
			auth := tls.NoClientCert
			if cfg.TLS.HTTPClientAuth == ClientAuthRequire {
				auth = tls.RequireAndVerifyClientCert
			}
			t.http = b.ServerConfig(auth)
			t.http.NextProtos = []string{"http/1.1"}
		}
		t.worker = b.ClientConfig(cfg.TLS.WorkerServerName)
		if cfg.NATS.Embedded {
			t.natsServer = b.ServerConfig(tls.RequireAndVerifyClientCert)
			// The edge dials its own server: verify it against a name
			// its certificate carries.
			t.natsClient = b.ClientConfig(selfName(b.KeyPair.Leaf()))
		}
	}
	if nt := cfg.NATS.TLS; nt.set() {
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

// warnings are the startup warnings about what runs unprotected.
func (t *edgeTLS) warnings(cfg *Config) []string {
	var w []string
	switch {
	case cfg.TLS.Mode == "":
		w = append(w, "no tls section: the cluster port, the HTTP API (admin token included), worker hops and NATS run PLAINTEXT; set tls.mode: mutual (or tls.mode: plaintext to say so explicitly)")
	case cfg.TLS.Mode == TLSModePlaintext:
		w = append(w, "tls.mode is plaintext: the cluster port, the HTTP API (admin token included), worker hops and NATS are unencrypted and peers are not authenticated by certificate")
	case !cfg.TLS.httpTLS():
		w = append(w, "tls.http is plaintext: the public and admin API (and the admin token) are unencrypted on this listener; keep it reachable only from the TLS-terminating gateway")
	}
	if cfg.TLS.mutual() && len(cfg.NATS.URLs) > 0 && !cfg.NATS.TLS.set() {
		w = append(w, "nats.urls without nats.tls: worker telemetry reaches this edge unencrypted and the NATS server is not authenticated")
	}
	if cfg.NATS.Embedded && !cfg.TLS.mutual() && len(cfg.NATS.WorkerUsers) == 0 {
		w = append(w, "embedded NATS without TLS or nats.worker_users: any client that reaches nats.listen (with nats.user's password, if set) can publish telemetry for any instance")
	}
	return w
}

// listener wraps the HTTP listener in TLS when configured.
func (t *edgeTLS) listener(ln net.Listener) net.Listener {
	if t.http == nil {
		return ln
	}
	return tls.NewListener(ln, t.http)
}

// scheme is the HTTP listener's URL scheme.
func (t *edgeTLS) scheme() string {
	if t.http == nil {
		return "http"
	}
	return "https"
}

// URL is the edge's base URL (https://host:port with TLS), "" before
// Start.
func (e *Edge) URL() string {
	if e.http.ln == nil {
		return ""
	}
	return e.tls.scheme() + "://" + e.http.ln.Addr().String()
}

// TLSMode is the transport security the edge runs: mutual or plaintext.
func (e *Edge) TLSMode() string {
	if e.cfg.TLS.mutual() {
		return TLSModeMutual
	}
	return TLSModePlaintext
}

// guardHops refuses plaintext hops in mutual mode: a worker that
// registered an http:// URL over telemetry is not sent prompts and signed
// hints in the clear. The hop fails like an unreachable instance (retried
// elsewhere, the breaker counts it) and the edge logs it once per host.
// With a certificate per worker, hops also go only to a server proving
// the instance's identity (workerident.go).
func (t *edgeTLS) guardHops(rt http.RoundTripper, log *slog.Logger, reg prometheus.Registerer) http.RoundTripper {
	if !t.cfg.mutual() {
		return rt
	}
	if t.cfg.checksWorkerIdentity() {
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

// natsClientOptions are the TLS and credential options of the edge's NATS
// connection.
func (t *edgeTLS) natsClientOptions() []nats.Option {
	if t.natsClient == nil {
		return nil
	}
	return []nats.Option{nats.Secure(t.natsClient)}
}
