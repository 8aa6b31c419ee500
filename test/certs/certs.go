// Package certs issues ephemeral certificates for tests and local
// deployments: a CA and per-node certificates (ECDSA P-256) valid for the
// loopback addresses, usable for mutual TLS between edges (cluster.Config.TLS),
// for the admin API and for edge → worker traffic.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is an in-memory certificate authority.
type CA struct {
	Cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	CertPEM []byte
}

// NewCA creates a CA named name, valid for a day.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"tether test"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("certs: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certs: parse CA certificate: %w", err)
	}
	return &CA{Cert: cert, key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Leaf is an issued certificate with its key.
type Leaf struct {
	TLS     tls.Certificate
	CertPEM []byte
	KeyPEM  []byte
}

// Issue signs a certificate for name (the common name, also a DNS SAN),
// valid as both server and client, for the given hosts (IPs or DNS names;
// 127.0.0.1, ::1 and localhost are always included).
func (ca *CA) Issue(name string, hosts ...string) (*Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: key for %s: %w", name, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"tether test"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{name, "localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("certs: certificate for %s: %w", name, err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("certs: marshal key for %s: %w", name, err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("certs: key pair for %s: %w", name, err)
	}
	return &Leaf{TLS: pair, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// Pool is a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// MutualTLS is a config for both ends of a mutually authenticated
// connection: it presents leaf, trusts only this CA and requires and
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

// Files are PEM files written by WriteFiles.
type Files struct{ CA, Cert, Key string }

// WriteFiles writes the CA certificate and leaf's certificate and key
// (mode 0600) into dir as ca.pem, <name>.pem and <name>-key.pem.
func (ca *CA) WriteFiles(dir, name string, leaf *Leaf) (Files, error) {
	f := Files{
		CA:   filepath.Join(dir, "ca.pem"),
		Cert: filepath.Join(dir, name+".pem"),
		Key:  filepath.Join(dir, name+"-key.pem"),
	}
	for path, data := range map[string][]byte{f.CA: ca.CertPEM, f.Cert: leaf.CertPEM, f.Key: leaf.KeyPEM} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return Files{}, fmt.Errorf("certs: write %s: %w", path, err)
		}
	}
	return f, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}
