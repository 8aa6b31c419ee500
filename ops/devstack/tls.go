package devstack

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/tether-project/tether/cluster/pki"
	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/edge/natsembed"
	"github.com/tether-project/tether/worker"
)

// tlsDirName is the directory of the stack's certificates in its data
// directory.
const tlsDirName = "tls"

// devCAValidity is how long a development CA lives. A kept data directory
// reuses its CA (so a developer's curl --cacert and open clients keep
// working across restarts) until less than devCARenewBefore remains.
const (
	devCAValidity    = 30 * 24 * time.Hour
	devCARenewBefore = 24 * time.Hour
)

// devPKI is the stack's ephemeral CA and every node's certificate files:
// edges (role edge), workers (role worker), the NATS server (role nats),
// all valid for the stack's loopback host.
type devPKI struct {
	dir    string
	caFile string
	pool   *tls.Config // client configuration trusting the CA
	files  map[string]pki.Files
}

// preparePKI creates (or, in a kept data directory, reuses) the CA and
// issues a fresh certificate for every node. No-op without MutualTLS.
func (s *Stack) preparePKI() error {
	if !s.opts.MutualTLS {
		return nil
	}
	dir := filepath.Join(s.dataDir, tlsDirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("devstack: tls dir: %w", err)
	}
	ca, found, err := pki.ReadCA(dir)
	if err != nil {
		return fmt.Errorf("devstack: %w (remove %s to start with a new CA)", err, dir)
	}
	if !found || time.Until(ca.Cert.NotAfter) < devCARenewBefore {
		if ca, err = pki.NewCA("tether dev CA", devCAValidity); err != nil {
			return fmt.Errorf("devstack: %w", err)
		}
		if err := ca.WriteCAKey(dir); err != nil {
			return fmt.Errorf("devstack: %w", err)
		}
	}
	p := &devPKI{dir: dir, caFile: filepath.Join(dir, "ca.pem"), files: map[string]pki.Files{}}
	p.pool = &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	issue := func(id string, role pki.Role) error {
		leaf, err := ca.Issue(id, pki.IssueOptions{Role: role, Hosts: []string{s.opts.Host}})
		if err != nil {
			return fmt.Errorf("devstack: %w", err)
		}
		f, err := ca.WriteFiles(dir, id, leaf)
		if err != nil {
			return fmt.Errorf("devstack: %w", err)
		}
		p.files[id] = f
		return nil
	}
	if err := issue("nats", pki.RoleNATS); err != nil {
		return err
	}
	for _, peer := range s.peers {
		if err := issue(peer.ID, pki.RoleEdge); err != nil {
			return err
		}
	}
	for _, sp := range workerSpecs(s.opts) {
		if err := issue(sp.id, pki.RoleWorker); err != nil {
			return err
		}
	}
	s.pki = p
	if tr, ok := s.client.Transport.(*http.Transport); ok {
		tr.TLSClientConfig = p.pool.Clone()
	}
	return nil
}

// natsTLS makes the NATS server require certificates from the CA and
// authorize clients by their identity (natsembed.CertAuth: a worker may
// publish only its own instance's telemetry).
func (s *Stack) natsTLS(opts *natsserver.Options) error {
	if s.pki == nil {
		return nil
	}
	f := s.pki.files["nats"]
	b, err := pki.Load(pki.Source{CAFile: f.CA, CertFile: f.Cert, KeyFile: f.Key})
	if err != nil {
		return fmt.Errorf("devstack: nats tls: %w", err)
	}
	opts.TLSConfig = b.ServerConfig(tls.RequireAndVerifyClientCert)
	opts.TLSVerify = true
	opts.TLSTimeout = 5
	opts.CustomClientAuthentication = natsembed.CertAuth{Logger: s.log}
	return nil
}

// workerTLS puts worker id on mutual TLS: its API (/v1/*) takes only
// edges' certificates, while /healthz, /readyz and /metrics stay open to a
// developer's curl (http_client_auth verify_if_given); its NATS connection
// presents its own certificate.
func (s *Stack) workerTLS(id string, c *worker.Config) {
	if s.pki == nil {
		return
	}
	f := s.pki.files[id]
	c.TLS = worker.ServerTLSConfig{Mode: worker.TLSModeMutual, CAFile: f.CA, CertFile: f.Cert, KeyFile: f.Key,
		HTTPClientAuth: worker.ClientAuthVerifyIfGiven, AllowedClients: []string{pki.IdentityURI(pki.RoleEdge, "*")}}
	c.NATS.TLS = worker.TLSConfig{CAFile: f.CA, CertFile: f.Cert, KeyFile: f.Key}
}

// edgeTLS puts edge id on mutual TLS: cluster port, HTTPS listener, hops
// to workers and its NATS connection.
func (s *Stack) edgeTLS(id string, c *edge.Config) {
	if s.pki == nil {
		c.TLS = edge.TLSConfig{Mode: edge.TLSModePlaintext}
		return
	}
	f := s.pki.files[id]
	c.TLS = edge.TLSConfig{Mode: edge.TLSModeMutual, CAFile: f.CA, CertFile: f.Cert, KeyFile: f.Key}
	c.NATS.TLS = edge.NATSTLSConfig{CAFile: f.CA, CertFile: f.Cert, KeyFile: f.Key}
}

// scheme is the edges' and workers' URL scheme.
func (s *Stack) scheme() string {
	if s.pki != nil {
		return "https"
	}
	return "http"
}

// MutualTLS reports whether the stack runs mutual TLS.
func (s *Stack) MutualTLS() bool { return s.pki != nil }

// CAFile is the path of the CA certificate every node's certificate
// chains to ("" without MutualTLS): curl --cacert CAFile.
func (s *Stack) CAFile() string {
	if s.pki == nil {
		return ""
	}
	return s.pki.caFile
}

// ClientTLS is a client configuration that trusts the stack's CA (nil
// without MutualTLS): what an HTTP client of the edges needs. The edges
// ask no client certificate.
func (s *Stack) ClientTLS() *tls.Config {
	if s.pki == nil {
		return nil
	}
	return s.pki.pool.Clone()
}

// CertFiles are the certificate files the stack issued for node id (an
// edge, a worker, or "nats"); ok is false without MutualTLS or for an
// unknown id.
func (s *Stack) CertFiles(id string) (pki.Files, bool) {
	if s.pki == nil {
		return pki.Files{}, false
	}
	f, ok := s.pki.files[id]
	return f, ok
}
