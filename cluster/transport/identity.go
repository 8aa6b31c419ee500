package transport

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"strings"
)

// Node identity in certificates. With TLS, a node's certificate must name
// its node id, so that a certificate the CA issued for someone else (a
// worker, another node) cannot act as this node:
//
//   - a URI SAN spiffe://tether/edge/<node-id> (what tether's pki issues);
//     a certificate carrying any spiffe://tether/ URI is judged by those
//     URIs alone, so a worker's spiffe://tether/worker/<id> never passes
//     for an edge of the same name;
//   - otherwise (a certificate from another PKI), a DNS SAN equal to the
//     node id.
//
// The accepting side checks the id a peer claims in the handshake against
// its client certificate (when the peer presented one: mutual TLS); the
// dialing side checks the server's certificate against the id it expects
// at that address (the latest Raft configuration), when it knows one.
const (
	identityScheme = "spiffe"
	identityDomain = "tether"
	identityRole   = "edge"
)

// NodeIdentityURI is the URI SAN that names a cluster node in its
// certificate: spiffe://tether/edge/<id>.
func NodeIdentityURI(id string) string {
	return identityScheme + "://" + identityDomain + "/" + identityRole + "/" + id
}

// certNamesNode reports whether cert names node id (see above).
func certNamesNode(cert *x509.Certificate, id string) bool {
	tetherURIs := false
	for _, u := range cert.URIs {
		if u.Scheme != identityScheme || u.Host != identityDomain {
			continue
		}
		tetherURIs = true
		if u.Path == "/"+identityRole+"/"+id {
			return true
		}
	}
	if tetherURIs {
		return false
	}
	return slices.Contains(cert.DNSNames, id)
}

// certNames lists what a certificate could be named by, for messages.
func certNames(cert *x509.Certificate) string {
	var names []string
	for _, u := range cert.URIs {
		names = append(names, u.String())
	}
	names = append(names, cert.DNSNames...)
	if len(names) == 0 {
		return fmt.Sprintf("no SAN (CN %q)", cert.Subject.CommonName)
	}
	return strings.Join(names, ", ")
}

// checkPeerIdentity verifies that the TLS peer of conn is node id: nil when
// conn is not TLS or the peer presented no certificate (TLS without client
// certificates authenticates the server only).
func checkPeerIdentity(conn net.Conn, id string) error {
	tc, ok := conn.(*tls.Conn)
	if !ok {
		return nil
	}
	certs := tc.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return nil
	}
	if !certNamesNode(certs[0], id) {
		return fmt.Errorf("the peer's certificate does not name node %q (want URI SAN %s or DNS SAN %q; it names %s)",
			id, NodeIdentityURI(id), id, certNames(certs[0]))
	}
	return nil
}
