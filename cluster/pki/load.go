package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// Source names the PEM files of one TLS identity: the CA that issued the
// peers' certificates, and this process's certificate (chain) and key.
type Source struct {
	CAFile, CertFile, KeyFile string
}

// Bundle is a loaded Source: the trusted CA pool and a key pair that
// follows its files when they are renewed.
type Bundle struct {
	Pool    *x509.CertPool
	KeyPair *KeyPair
}

// Load reads the CA file and the key pair. Errors name the file and the
// source field (ca_file, cert_file, key_file), so a caller prefixes its
// configuration section and the message names the key.
func Load(s Source) (*Bundle, error) {
	if s.CAFile == "" {
		return nil, errors.New("ca_file: required")
	}
	if s.CertFile == "" {
		return nil, errors.New("cert_file: required")
	}
	if s.KeyFile == "" {
		return nil, errors.New("key_file: required")
	}
	pool, err := LoadPool(s.CAFile)
	if err != nil {
		return nil, fmt.Errorf("ca_file: %w", err)
	}
	kp, err := LoadKeyPair(s.CertFile, s.KeyFile)
	if err != nil {
		return nil, err
	}
	return &Bundle{Pool: pool, KeyPair: kp}, nil
}

// LoadPool reads a PEM file of CA certificates.
func LoadPool(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// ServerConfig accepts connections with this bundle's certificate; with
// clientAuth tls.RequireAndVerifyClientCert (or VerifyClientCertIfGiven)
// client certificates are verified against the bundle's CA.
func (b *Bundle) ServerConfig(clientAuth tls.ClientAuthType) *tls.Config {
	return &tls.Config{
		GetCertificate: b.KeyPair.GetCertificate,
		ClientCAs:      b.Pool,
		ClientAuth:     clientAuth,
		MinVersion:     tls.VersionTLS12,
	}
}

// ClientConfig dials with this bundle's certificate and trusts only its CA.
// serverName, when set, is the name the server's certificate must carry
// instead of the dialed host.
func (b *Bundle) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{
		GetClientCertificate: b.KeyPair.GetClientCertificate,
		RootCAs:              b.Pool,
		ServerName:           serverName,
		MinVersion:           tls.VersionTLS12,
	}
}

// MutualConfig is one configuration for both ends of an internal link
// (tether's cluster port): it presents the bundle's certificate as server
// and client, trusts only the CA and requires the peer's certificate. TLS
// 1.3 only: both ends are tether.
func (b *Bundle) MutualConfig() *tls.Config {
	return &tls.Config{
		GetCertificate:       b.KeyPair.GetCertificate,
		GetClientCertificate: b.KeyPair.GetClientCertificate,
		RootCAs:              b.Pool,
		ClientCAs:            b.Pool,
		ClientAuth:           tls.RequireAndVerifyClientCert,
		MinVersion:           tls.VersionTLS13,
	}
}

// reloadCheckInterval bounds how often a KeyPair stats its files.
const reloadCheckInterval = time.Second

// KeyPair is a certificate and key loaded from files and reloaded when the
// files change (cert-manager and kubelet renew mounted Secrets in place), so
// a long-running edge or worker presents the renewed certificate without a
// restart. A failed reload (a half-written pair) keeps the previous pair
// and is retried at the next check.
type KeyPair struct {
	certFile, keyFile string

	mu        sync.Mutex
	cert      *tls.Certificate
	stamp     string // modification times and sizes of both files
	lastCheck time.Time
	lastErr   error
}

// LoadKeyPair loads certFile and keyFile (PEM).
func LoadKeyPair(certFile, keyFile string) (*KeyPair, error) {
	k := &KeyPair{certFile: certFile, keyFile: keyFile}
	stamp, err := k.statStamp()
	if err != nil {
		return nil, err
	}
	if err := k.load(stamp); err != nil {
		return nil, err
	}
	k.lastCheck = time.Now()
	return k, nil
}

func (k *KeyPair) statStamp() (string, error) {
	var b strings.Builder
	for _, f := range []struct{ key, path string }{{"cert_file", k.certFile}, {"key_file", k.keyFile}} {
		st, err := os.Stat(f.path)
		if err != nil {
			return "", fmt.Errorf("%s: %w", f.key, err)
		}
		fmt.Fprintf(&b, "%d/%d;", st.ModTime().UnixNano(), st.Size())
	}
	return b.String(), nil
}

func (k *KeyPair) load(stamp string) error {
	pair, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		return fmt.Errorf("cert_file %s / key_file %s: %w", k.certFile, k.keyFile, err)
	}
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return fmt.Errorf("cert_file %s: %w", k.certFile, err)
		}
	}
	k.cert, k.stamp = &pair, stamp
	return nil
}

// current returns the pair, reloading it first if the files changed.
func (k *KeyPair) current() *tls.Certificate {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := time.Now()
	if now.Sub(k.lastCheck) < reloadCheckInterval {
		return k.cert
	}
	k.lastCheck = now
	stamp, err := k.statStamp()
	if err == nil && stamp != k.stamp {
		err = k.load(stamp)
	}
	k.lastErr = err
	return k.cert
}

// Reload re-reads the files now (not waiting for the next check).
func (k *KeyPair) Reload() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	stamp, err := k.statStamp()
	if err == nil {
		err = k.load(stamp)
	}
	k.lastCheck, k.lastErr = time.Now(), err
	return err
}

// LastError is the last failed reload's error (nil after a success).
func (k *KeyPair) LastError() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lastErr
}

// Leaf is the current certificate.
func (k *KeyPair) Leaf() *x509.Certificate { return k.current().Leaf }

// GetCertificate is for tls.Config.GetCertificate.
func (k *KeyPair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return k.current(), nil
}

// GetClientCertificate is for tls.Config.GetClientCertificate.
func (k *KeyPair) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return k.current(), nil
}
