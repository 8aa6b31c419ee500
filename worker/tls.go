package worker

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/tether-project/tether/cluster/pki"
)

// Transport security of the worker's HTTP listener (tls.mode).
const (
	// TLSModeMutual: the listener serves TLS with cert_file and requires
	// (http_client_auth) certificates from ca_file.
	TLSModeMutual = "mutual"
	// TLSModePlaintext: plain HTTP (a warning at startup). Hints stay
	// signed, but prompts and answers cross the network in the clear and
	// anyone who reaches the port can send requests.
	TLSModePlaintext = "plaintext"
)

// Client authentication on the listener (tls.http_client_auth).
const (
	// ClientAuthRequire: the TLS handshake fails without a certificate
	// from the CA (every endpoint, health and metrics included).
	ClientAuthRequire = "require"
	// ClientAuthVerifyIfGiven: a certificate is verified when presented;
	// /v1/* then needs one (401 otherwise) while /health, /healthz, /readyz and
	// /metrics stay open to probes and scrapers without certificates.
	ClientAuthVerifyIfGiven = "verify_if_given"
)

// ServerTLSConfig is the tls section: the worker's HTTP listener.
type ServerTLSConfig struct {
	// Mode is mutual or plaintext. A file without it runs plaintext with a
	// warning; DefaultConfig says plaintext explicitly.
	Mode string `yaml:"mode"`
	// CAFile verifies clients' certificates; CertFile and KeyFile are
	// the worker's (renewed files are picked up without a restart).
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// HTTPClientAuth is require (default) or verify_if_given.
	HTTPClientAuth string `yaml:"http_client_auth" was:"client_auth"`
	// AllowedClients are name patterns (a URI, DNS name or CN, with an
	// optional trailing '*') one of which a client certificate must
	// carry, e.g. spiffe://tether/edge/*; empty: any certificate from
	// the CA.
	AllowedClients []string `yaml:"allowed_clients"`
}

func (t ServerTLSConfig) mutual() bool { return t.Mode == TLSModeMutual }

// validate checks the tls section; errors name the key.
func (t ServerTLSConfig) validate(advertiseURL string) error {
	files := []struct{ key, path string }{{"tls.ca_file", t.CAFile}, {"tls.cert_file", t.CertFile}, {"tls.key_file", t.KeyFile}}
	switch t.Mode {
	case TLSModeMutual:
		// New reads the files (errors name the key): a configuration
		// is checked where its certificates are not mounted.
		for _, f := range files {
			if f.path == "" {
				return fmt.Errorf("%s: required with tls.mode: mutual", f.key)
			}
		}
		switch t.HTTPClientAuth {
		case "", ClientAuthRequire, ClientAuthVerifyIfGiven:
		default:
			return fmt.Errorf("tls.http_client_auth: unknown value %q (allowed: require, verify_if_given)", t.HTTPClientAuth)
		}
		for i, p := range t.AllowedClients {
			if err := pki.ValidatePattern(p); err != nil {
				return fmt.Errorf("tls.allowed_clients[%d]: %v", i, err)
			}
		}
		if strings.HasPrefix(advertiseURL, "http://") {
			return fmt.Errorf("advertise_url: %s is plaintext but tls.mode is mutual (use https://)", advertiseURL)
		}
	case "", TLSModePlaintext:
		for _, f := range files {
			if f.path != "" {
				return fmt.Errorf("%s: set, but tls.mode is %q: certificates are used only with tls.mode: mutual", f.key, t.Mode)
			}
		}
		if t.HTTPClientAuth != "" || len(t.AllowedClients) > 0 {
			return errors.New("tls.http_client_auth: client certificates need tls.mode: mutual")
		}
	default:
		return fmt.Errorf("tls.mode: unknown value %q (allowed: mutual, plaintext)", t.Mode)
	}
	return nil
}

// workerTLS is the loaded listener configuration (nil server: plaintext).
type workerTLS struct {
	cfg    ServerTLSConfig
	server *tls.Config
}

func loadServerTLS(t ServerTLSConfig) (*workerTLS, error) {
	w := &workerTLS{cfg: t}
	if !t.mutual() {
		return w, nil
	}
	b, err := pki.Load(pki.Source{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile})
	if err != nil {
		return nil, fmt.Errorf("tls.%w", err)
	}
	optional := t.HTTPClientAuth == ClientAuthVerifyIfGiven
	auth := tls.RequireAndVerifyClientCert
	if optional {
		auth = tls.VerifyClientCertIfGiven
	}
	w.server = b.ServerConfig(auth)
	w.server.NextProtos = []string{"http/1.1"}
	if len(t.AllowedClients) > 0 {
		w.server.VerifyConnection = pki.VerifyPeerNames(t.AllowedClients, optional)
	}
	return w, nil
}

// warnings are the startup warnings about what runs unprotected.
func (w *workerTLS) warnings() []string {
	switch w.cfg.Mode {
	case "":
		return []string{"no tls section: the HTTP API runs PLAINTEXT and accepts requests from anyone who reaches it; set tls.mode: mutual (or tls.mode: plaintext to say so explicitly)"}
	case TLSModePlaintext:
		return []string{"tls.mode is plaintext: prompts and answers are unencrypted and callers are not authenticated by certificate (sub-agent hints stay signed)"}
	}
	return nil
}

func (w *workerTLS) listener(ln net.Listener) net.Listener {
	if w.server == nil {
		return ln
	}
	return tls.NewListener(ln, w.server)
}

func (w *workerTLS) scheme() string {
	if w.server == nil {
		return "http"
	}
	return "https"
}

// guard, with http_client_auth verify_if_given, answers 401 on the API
// endpoints to clients that presented no certificate (the handshake
// already verified any certificate that was presented, and its names).
func (w *workerTLS) guard(next http.Handler) http.Handler {
	if w.server == nil || w.cfg.HTTPClientAuth != ClientAuthVerifyIfGiven {
		return next
	}
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/") && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
			writeAPIError(rw, newAPIError(http.StatusUnauthorized, "authentication_error", "client_certificate_required", "",
				"%s needs a client certificate from the deployment's CA (tls.http_client_auth: verify_if_given)", truncate(r.URL.Path, 200)))
			return
		}
		next.ServeHTTP(rw, r)
	})
}

// TLSMode is the listener's transport security: mutual or plaintext.
func (s *Server) TLSMode() string {
	if s.tls.server != nil {
		return TLSModeMutual
	}
	return TLSModePlaintext
}

// natsClientTLS is the NATS connection's TLS configuration (nats.tls); the
// client certificate is re-read when its files are renewed.
func natsClientTLS(t TLSConfig) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pool, err := pki.LoadPool(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("nats.tls.ca_file: %w", err)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		kp, err := pki.LoadKeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("nats.tls.%w", err)
		}
		tc.GetClientCertificate = kp.GetClientCertificate
	}
	return tc, nil
}
