package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
)

// Names lists what cert is called: its URI SANs, DNS SANs and Subject CN,
// in that order.
func Names(cert *x509.Certificate) []string {
	var out []string
	for _, u := range cert.URIs {
		out = append(out, u.String())
	}
	out = append(out, cert.DNSNames...)
	if cert.Subject.CommonName != "" {
		out = append(out, cert.Subject.CommonName)
	}
	return out
}

// ValidatePattern checks a name pattern: a name, or a prefix followed by a
// single trailing '*' (spiffe://tether/edge/*, tether-edge-*).
func ValidatePattern(p string) error {
	if strings.TrimSpace(p) == "" {
		return errors.New("empty pattern")
	}
	if i := strings.IndexByte(p, '*'); i >= 0 && i != len(p)-1 {
		return fmt.Errorf("%q: '*' is allowed only at the end", p)
	}
	if p == "*" {
		return fmt.Errorf("%q matches every certificate: leave the list empty instead", p)
	}
	return nil
}

// MatchName reports whether name matches pattern (exact, or prefix when the
// pattern ends in '*').
func MatchName(pattern, name string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(name, prefix)
	}
	return pattern == name
}

// Matches reports whether any of cert's names matches any pattern.
func Matches(cert *x509.Certificate, patterns []string) bool {
	for _, n := range Names(cert) {
		for _, p := range patterns {
			if MatchName(p, n) {
				return true
			}
		}
	}
	return false
}

// VerifyPeerNames returns a tls.Config.VerifyConnection check (it runs
// after the chain was verified) that the peer's certificate names one of
// patterns. With optional, a peer without a certificate passes (the server
// then decides per request); without, it fails.
func VerifyPeerNames(patterns []string, optional bool) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			if optional {
				return nil
			}
			return errors.New("pki: the peer presented no certificate")
		}
		leaf := cs.PeerCertificates[0]
		if !Matches(leaf, patterns) {
			return fmt.Errorf("pki: peer certificate %s (names %v) matches none of %v", leaf.Subject.CommonName, Names(leaf), patterns)
		}
		return nil
	}
}
