// Package certs issues ephemeral certificates for tests: a thin wrapper over
// pki (the one implementation, also used by `tether dev`) that keeps the
// short signatures the reliability tests were written against. New code can
// use pki directly (roles, validity windows).
package certs

import (
	"crypto/tls"
	"crypto/x509"
	"time"

	"github.com/tether-project/tether/cluster/pki"
)

// CA is an in-memory certificate authority, valid for a day.
type CA struct {
	*pki.CA
}

// Leaf is an issued certificate with its key.
type Leaf = pki.Leaf

// Files are PEM files written by WriteFiles.
type Files = pki.Files

// NewCA creates a CA named name, valid for a day.
func NewCA(name string) (*CA, error) {
	ca, err := pki.NewCA(name, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	return &CA{ca}, nil
}

// Issue signs a certificate for name (the common name, also a DNS SAN and
// the edge identity spiffe://tether/edge/<name>), valid as both server and
// client, for the given hosts (loopback is always included).
func (ca *CA) Issue(name string, hosts ...string) (*Leaf, error) {
	return ca.CA.Issue(name, pki.IssueOptions{Role: pki.RoleEdge, Hosts: hosts})
}

// Pool is a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool { return ca.CA.Pool() }

// MutualTLS is a config for both ends of a mutually authenticated
// connection: it presents leaf, trusts only this CA and requires and
// verifies the peer's certificate.
func (ca *CA) MutualTLS(leaf *Leaf) *tls.Config { return ca.CA.MutualTLS(leaf) }
