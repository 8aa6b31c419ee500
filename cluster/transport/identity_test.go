package transport

import (
	"crypto/x509"
	"net/url"
	"testing"
)

func TestCertNamesNode(t *testing.T) {
	u := func(s string) *url.URL {
		v, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	cases := []struct {
		name string
		cert x509.Certificate
		id   string
		want bool
	}{
		{"edge URI", x509.Certificate{URIs: []*url.URL{u("spiffe://tether/edge/n1")}}, "n1", true},
		{"edge URI of another node", x509.Certificate{URIs: []*url.URL{u("spiffe://tether/edge/n2")}}, "n1", false},
		{"worker URI with the node's DNS name", x509.Certificate{URIs: []*url.URL{u("spiffe://tether/worker/n1")}, DNSNames: []string{"n1"}}, "n1", false},
		{"edge URI among others", x509.Certificate{URIs: []*url.URL{u("spiffe://tether/client/ops"), u("spiffe://tether/edge/n1")}}, "n1", true},
		{"DNS SAN only (another PKI)", x509.Certificate{DNSNames: []string{"localhost", "n1"}}, "n1", true},
		{"foreign URI, DNS SAN", x509.Certificate{URIs: []*url.URL{u("spiffe://corp/x")}, DNSNames: []string{"n1"}}, "n1", true},
		{"CN only", x509.Certificate{}, "n1", false},
		{"prefix is not a match", x509.Certificate{URIs: []*url.URL{u("spiffe://tether/edge/n10")}}, "n1", false},
	}
	for _, c := range cases {
		if got := certNamesNode(&c.cert, c.id); got != c.want {
			t.Errorf("%s: certNamesNode(%q) = %v, want %v", c.name, c.id, got, c.want)
		}
	}
}
