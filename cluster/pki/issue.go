// Package pki is tether's certificate handling: issuing an ephemeral CA and
// per-node certificates (tether dev, tests), loading certificate files into
// TLS configurations that pick up renewed files (edges, workers), and the
// identity a certificate carries.
//
// Identity. A tether certificate names its holder three ways, so that
// whatever a verifier or an external PKI prefers is there:
//
//   - a URI SAN spiffe://tether/<role>/<id> (role: edge, worker, nats,
//     client) — what tether's own checks read (IdentityOf);
//   - a DNS SAN and the Subject CN equal to the id (the edge's node id, the
//     worker's instance id);
//   - DNS/IP SANs for the addresses the holder is dialed at (hostname
//     verification by ordinary TLS clients: curl, the agent gateway).
//
// The package imports only the standard library, so every layer may use it.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// TrustDomain is the authority part of tether's identity URIs.
const TrustDomain = "tether"

// Role is what a certificate's holder is in a tether deployment.
type Role string

// Roles.
const (
	RoleEdge   Role = "edge"   // a cluster member: Raft, forwarding, NATS subscriber, client of workers
	RoleWorker Role = "worker" // an inference worker: HTTP server for edges, NATS publisher
	RoleNATS   Role = "nats"   // a NATS server
	RoleClient Role = "client" // an operator tool or gateway calling an edge
)

// Valid reports whether r is one of the roles above.
func (r Role) Valid() bool {
	switch r {
	case RoleEdge, RoleWorker, RoleNATS, RoleClient:
		return true
	}
	return false
}

// IdentityURI is the URI SAN naming id in role: spiffe://tether/<role>/<id>.
func IdentityURI(role Role, id string) string {
	return "spiffe://" + TrustDomain + "/" + string(role) + "/" + id
}

// Identity is the tether identity a certificate carries.
type Identity struct {
	Role Role
	ID   string
}

func (i Identity) String() string { return IdentityURI(i.Role, i.ID) }

// IdentityOf reads the tether identity from cert's URI SANs. A certificate
// with no spiffe://tether/<role>/<id> URI, or with several different ones,
// has none (ok false): ambiguity must not pick the more privileged one.
func IdentityOf(cert *x509.Certificate) (Identity, bool) {
	var found []Identity
	for _, u := range cert.URIs {
		if u.Scheme != "spiffe" || u.Host != TrustDomain {
			continue
		}
		role, id, ok := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
		if !ok || id == "" || strings.Contains(id, "/") || !Role(role).Valid() {
			continue
		}
		found = append(found, Identity{Role: Role(role), ID: id})
	}
	if len(found) == 0 {
		return Identity{}, false
	}
	for _, f := range found[1:] {
		if f != found[0] {
			return Identity{}, false
		}
	}
	return found[0], true
}

// CA is an in-memory certificate authority.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	key     *ecdsa.PrivateKey
}

// NewCA creates a self-signed CA named name, valid from an hour ago (clock
// skew between processes) for validFor.
func NewCA(name string, validFor time.Duration) (*CA, error) {
	if validFor <= 0 {
		return nil, fmt.Errorf("pki: CA %s: validity %s must be positive", name, validFor)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"tether"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validFor),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parse CA certificate: %w", err)
	}
	return &CA{Cert: cert, key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// IssueOptions shape an issued certificate. Zero fields take defaults.
type IssueOptions struct {
	// Role, when set, adds the URI SAN spiffe://tether/<role>/<id>.
	Role Role
	// Hosts are extra DNS names or IP addresses the holder is dialed at.
	// The id itself, localhost, 127.0.0.1 and ::1 are always included.
	Hosts []string
	// NotBefore and NotAfter default to an hour ago and the CA's expiry
	// (tests set them to issue expired or not-yet-valid certificates).
	NotBefore, NotAfter time.Time
}

// Leaf is an issued certificate with its private key.
type Leaf struct {
	TLS     tls.Certificate
	Cert    *x509.Certificate
	CertPEM []byte
	KeyPEM  []byte
}

// Issue signs a certificate for id (Subject CN and a DNS SAN), valid for
// both server and client authentication.
func (ca *CA) Issue(id string, o IssueOptions) (*Leaf, error) {
	if id == "" {
		return nil, errors.New("pki: issue: empty id")
	}
	if o.Role != "" && !o.Role.Valid() {
		return nil, fmt.Errorf("pki: issue %s: unknown role %q", id, o.Role)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: key for %s: %w", id, err)
	}
	notBefore, notAfter := o.NotBefore, o.NotAfter
	if notBefore.IsZero() {
		notBefore = time.Now().Add(-time.Hour)
	}
	if notAfter.IsZero() {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: id, Organization: []string{"tether"}},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	dns := map[string]bool{}
	addDNS := func(h string) {
		if h != "" && !dns[h] {
			dns[h] = true
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	if net.ParseIP(id) == nil {
		addDNS(id)
	}
	addDNS("localhost")
	for _, h := range o.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			addDNS(h)
		}
	}
	if o.Role != "" {
		u, err := url.Parse(IdentityURI(o.Role, id))
		if err != nil {
			return nil, fmt.Errorf("pki: issue %s: identity URI: %w", id, err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("pki: certificate for %s: %w", id, err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("pki: marshal key for %s: %w", id, err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: key pair for %s: %w", id, err)
	}
	return &Leaf{TLS: pair, Cert: pair.Leaf, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// Pool is a certificate pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// MutualTLS is a configuration for either end of a mutually authenticated
// connection: it presents leaf, trusts only this CA, and requires and
// verifies the peer's certificate.
func (ca *CA) MutualTLS(leaf *Leaf) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{leaf.TLS},
		RootCAs:      ca.Pool(),
		ClientCAs:    ca.Pool(),
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
	}
}

// Files are the paths of a CA certificate and one holder's certificate and
// key (PEM).
type Files struct{ CA, Cert, Key string }

// WriteCA writes the CA certificate to dir/ca.pem (mode 0644: it is public)
// and returns the path.
func (ca *CA) WriteCA(dir string) (string, error) {
	path := filepath.Join(dir, caCertName)
	if err := writeFileAtomic(path, ca.CertPEM, 0o644); err != nil {
		return "", err
	}
	return path, nil
}

// WriteFiles writes the CA certificate and leaf's certificate and key into
// dir as ca.pem, <name>.pem and <name>-key.pem (the key mode 0600).
func (ca *CA) WriteFiles(dir, name string, leaf *Leaf) (Files, error) {
	caPath, err := ca.WriteCA(dir)
	if err != nil {
		return Files{}, err
	}
	f := Files{CA: caPath, Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem")}
	if err := writeFileAtomic(f.Cert, leaf.CertPEM, 0o644); err != nil {
		return Files{}, err
	}
	if err := writeFileAtomic(f.Key, leaf.KeyPEM, 0o600); err != nil {
		return Files{}, err
	}
	return f, nil
}

// writeFileAtomic writes through a temporary file and a rename, so a
// process reloading the file never reads half of it.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	merr := os.Chmod(tmp.Name(), mode)
	if err := errors.Join(werr, cerr, merr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

// CA files in a directory (WriteCAKey, ReadCA).
const (
	caCertName = "ca.pem"
	caKeyName  = "ca-key.pem"
)

// WriteCAKey writes the CA's certificate and private key (mode 0600) into
// dir, so a CA can be reused by a later process (ReadCA). Only for
// development CAs: a production CA key does not live beside the nodes.
func (ca *CA) WriteCAKey(dir string) error {
	der, err := x509.MarshalECPrivateKey(ca.key)
	if err != nil {
		return fmt.Errorf("pki: marshal CA key: %w", err)
	}
	if _, err := ca.WriteCA(dir); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, caKeyName), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

// ReadCA reads a CA written by WriteCAKey from dir. found is false when dir
// holds no CA key.
func ReadCA(dir string) (ca *CA, found bool, err error) {
	keyPEM, err := os.ReadFile(filepath.Join(dir, caKeyName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("pki: read CA key: %w", err)
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, caCertName))
	if err != nil {
		return nil, false, fmt.Errorf("pki: read CA certificate: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, false, fmt.Errorf("pki: %s: not a PEM CA certificate and key", dir)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, false, fmt.Errorf("pki: parse CA certificate in %s: %w", dir, err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, false, fmt.Errorf("pki: parse CA key in %s: %w", dir, err)
	}
	if !cert.IsCA || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, false, fmt.Errorf("pki: %s: the key does not belong to a CA certificate", dir)
	}
	return &CA{Cert: cert, CertPEM: certPEM, key: key}, true, nil
}
