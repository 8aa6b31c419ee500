package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func mustCA(t *testing.T, name string) *CA {
	t.Helper()
	ca, err := NewCA(name, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustIssue(t *testing.T, ca *CA, id string, o IssueOptions) *Leaf {
	t.Helper()
	l, err := ca.Issue(id, o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// handshake runs a real TLS handshake over loopback TCP and returns the
// client's and the server's errors.
func handshake(t *testing.T, server, client *tls.Config) (clientErr, serverErr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		tc := tls.Server(c, server)
		err = tc.Handshake()
		if err == nil {
			// TLS 1.3: the client learns of a refused client
			// certificate only on its first read.
			_, err = tc.Write([]byte("ok"))
		}
		done <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(c, client)
	clientErr = tc.Handshake()
	if clientErr == nil {
		buf := make([]byte, 2)
		_, clientErr = io.ReadFull(tc, buf)
	}
	serverErr = <-done
	return clientErr, serverErr
}

func TestIssuedCertificatesCarryTheIdentity(t *testing.T) {
	ca := mustCA(t, "test-ca")
	leaf := mustIssue(t, ca, "edge-1", IssueOptions{Role: RoleEdge, Hosts: []string{"edge-1.example", "10.0.0.7"}})
	id, ok := IdentityOf(leaf.Cert)
	if !ok || id != (Identity{RoleEdge, "edge-1"}) {
		t.Fatalf("identity %+v %v", id, ok)
	}
	if got := id.String(); got != "spiffe://tether/edge/edge-1" {
		t.Fatalf("identity URI %s", got)
	}
	names := strings.Join(Names(leaf.Cert), " ")
	for _, want := range []string{"spiffe://tether/edge/edge-1", "edge-1", "localhost", "edge-1.example"} {
		if !strings.Contains(names, want) {
			t.Errorf("names %q lack %q", names, want)
		}
	}
	if _, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "edge-1.example", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("verify as server for edge-1.example: %v", err)
	}
	if _, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("verify as client: %v", err)
	}
	if err := leaf.Cert.VerifyHostname("10.0.0.7"); err != nil {
		t.Errorf("IP SAN: %v", err)
	}
	if err := leaf.Cert.VerifyHostname("127.0.0.1"); err != nil {
		t.Errorf("loopback SAN: %v", err)
	}
	// No role: no identity; an unknown role is refused.
	plain := mustIssue(t, ca, "x", IssueOptions{})
	if _, ok := IdentityOf(plain.Cert); ok {
		t.Error("a certificate without a role URI has an identity")
	}
	if _, err := ca.Issue("x", IssueOptions{Role: "root"}); err == nil {
		t.Error("issued a certificate with an unknown role")
	}
	if _, err := ca.Issue("", IssueOptions{}); err == nil {
		t.Error("issued a certificate without an id")
	}
}

func TestMutualTLSHandshakes(t *testing.T) {
	ca := mustCA(t, "test-ca")
	rogue := mustCA(t, "rogue-ca")
	server := mustIssue(t, ca, "w1", IssueOptions{Role: RoleWorker})
	client := mustIssue(t, ca, "edge-1", IssueOptions{Role: RoleEdge})
	otherWorker := mustIssue(t, ca, "w2", IssueOptions{Role: RoleWorker})
	foreign := mustIssue(t, rogue, "edge-1", IssueOptions{Role: RoleEdge})
	expired := mustIssue(t, ca, "edge-1", IssueOptions{Role: RoleEdge, NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})

	srv := &tls.Config{Certificates: []tls.Certificate{server.TLS}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
		VerifyConnection: VerifyPeerNames([]string{"spiffe://tether/edge/*"}, false)}
	cli := func(l *Leaf) *tls.Config {
		c := &tls.Config{RootCAs: ca.Pool(), ServerName: "w1", MinVersion: tls.VersionTLS13}
		if l != nil {
			// GetClientCertificate presents the certificate even when
			// the server's accepted CAs do not include its issuer.
			c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &l.TLS, nil }
		}
		return c
	}
	if cerr, serr := handshake(t, srv, cli(client)); cerr != nil || serr != nil {
		t.Fatalf("valid edge certificate: client %v, server %v", cerr, serr)
	}
	for name, c := range map[string]*tls.Config{
		"no certificate":        cli(nil),
		"another CA":            cli(foreign),
		"expired":               cli(expired),
		"a worker's identity":   cli(otherWorker),
		"server name mismatch":  func() *tls.Config { c := cli(client); c.ServerName = "w9"; return c }(),
		"untrusted server root": func() *tls.Config { c := cli(client); c.RootCAs = rogue.Pool(); return c }(),
	} {
		cerr, serr := handshake(t, srv, c)
		if cerr == nil && serr == nil {
			t.Errorf("%s: handshake succeeded", name)
			continue
		}
		t.Logf("%s: refused (client: %v; server: %v)", name, cerr, serr)
	}
}

func TestLoadAndReload(t *testing.T) {
	ca := mustCA(t, "test-ca")
	dir := t.TempDir()
	first := mustIssue(t, ca, "edge-1", IssueOptions{Role: RoleEdge})
	files, err := ca.WriteFiles(dir, "edge-1", first)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(files.Key); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v %v", st.Mode(), err)
	}
	b, err := Load(Source{CAFile: files.CA, CertFile: files.Cert, KeyFile: files.Key})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.KeyPair.Leaf().SerialNumber; got.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatalf("loaded serial %v, want %v", got, first.Cert.SerialNumber)
	}
	// Renewal: new files in place. Reload picks them up; a broken pair
	// (key not yet written) keeps the previous certificate.
	second := mustIssue(t, ca, "edge-1", IssueOptions{Role: RoleEdge})
	if _, err := ca.WriteFiles(dir, "edge-1", second); err != nil {
		t.Fatal(err)
	}
	if err := b.KeyPair.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := b.KeyPair.Leaf().SerialNumber; got.Cmp(second.Cert.SerialNumber) != 0 {
		t.Fatalf("after renewal serial %v, want %v", got, second.Cert.SerialNumber)
	}
	third := mustIssue(t, ca, "edge-1", IssueOptions{Role: RoleEdge})
	if err := os.WriteFile(files.Cert, third.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := b.KeyPair.Reload(); err == nil {
		t.Fatal("a certificate that does not match its key reloaded")
	}
	if got := b.KeyPair.Leaf().SerialNumber; got.Cmp(second.Cert.SerialNumber) != 0 {
		t.Fatalf("a failed reload replaced the certificate")
	}

	// Errors name the field and the file.
	cases := []struct {
		src  Source
		want string
	}{
		{Source{CertFile: files.Cert, KeyFile: files.Key}, "ca_file: required"},
		{Source{CAFile: files.CA, KeyFile: files.Key}, "cert_file: required"},
		{Source{CAFile: filepath.Join(dir, "missing.pem"), CertFile: files.Cert, KeyFile: files.Key}, "ca_file: open"},
		{Source{CAFile: files.Key, CertFile: files.Cert, KeyFile: files.Key}, "holds no PEM certificate"},
		{Source{CAFile: files.CA, CertFile: filepath.Join(dir, "nope.pem"), KeyFile: files.Key}, "cert_file: stat"},
	}
	for _, c := range cases {
		_, err := Load(c.src)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Load(%+v): %v, want %q", c.src, err, c.want)
		}
	}
}

func TestBundleConfigsHandshake(t *testing.T) {
	ca := mustCA(t, "test-ca")
	dir := t.TempDir()
	load := func(id string, role Role) *Bundle {
		f, err := ca.WriteFiles(dir, id, mustIssue(t, ca, id, IssueOptions{Role: role}))
		if err != nil {
			t.Fatal(err)
		}
		b, err := Load(Source{CAFile: f.CA, CertFile: f.Cert, KeyFile: f.Key})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	e1, e2, w := load("edge-1", RoleEdge), load("edge-2", RoleEdge), load("w1", RoleWorker)
	c := e2.MutualConfig()
	c.ServerName = "127.0.0.1"
	if cerr, serr := handshake(t, e1.MutualConfig(), c); cerr != nil || serr != nil {
		t.Fatalf("edge to edge: %v / %v", cerr, serr)
	}
	srv := w.ServerConfig(tls.RequireAndVerifyClientCert)
	srv.VerifyConnection = VerifyPeerNames([]string{IdentityURI(RoleEdge, "*")}, false)
	if cerr, serr := handshake(t, srv, e1.ClientConfig("w1")); cerr != nil || serr != nil {
		t.Fatalf("edge to worker: %v / %v", cerr, serr)
	}
	// A worker's certificate is not an edge's.
	if cerr, serr := handshake(t, srv, load("w2", RoleWorker).ClientConfig("w1")); cerr == nil && serr == nil {
		t.Fatal("a worker certificate passed the edge name check")
	}
	// Optional client certificates: no certificate passes the name check.
	opt := w.ServerConfig(tls.VerifyClientCertIfGiven)
	opt.VerifyConnection = VerifyPeerNames([]string{IdentityURI(RoleEdge, "*")}, true)
	anon := &tls.Config{RootCAs: ca.Pool(), ServerName: "w1", MinVersion: tls.VersionTLS12}
	if cerr, serr := handshake(t, opt, anon); cerr != nil || serr != nil {
		t.Fatalf("no client certificate with optional auth: %v / %v", cerr, serr)
	}
}

func TestNamePatterns(t *testing.T) {
	for _, p := range []string{"", " ", "*", "a*b", "**"} {
		if ValidatePattern(p) == nil {
			t.Errorf("pattern %q accepted", p)
		}
	}
	for _, p := range []string{"edge-1", "tether-edge-*", "spiffe://tether/edge/*"} {
		if err := ValidatePattern(p); err != nil {
			t.Errorf("pattern %q: %v", p, err)
		}
	}
	if !MatchName("tether-edge-*", "tether-edge-0") || MatchName("tether-edge-*", "tether-worker") || !MatchName("a", "a") || MatchName("a", "ab") {
		t.Error("MatchName")
	}
	err := VerifyPeerNames([]string{"x"}, false)(tls.ConnectionState{})
	if err == nil || !errors.Is(err, err) || !strings.Contains(err.Error(), "no certificate") {
		t.Errorf("no certificate: %v", err)
	}
}

func TestIdentityIsUnambiguous(t *testing.T) {
	ca := mustCA(t, "test-ca")
	leaf := mustIssue(t, ca, "n1", IssueOptions{Role: RoleWorker})
	cert := *leaf.Cert
	u2 := *cert.URIs[0]
	u2.Path = "/edge/n1"
	cert.URIs = append(cert.URIs, &u2)
	if _, ok := IdentityOf(&cert); ok {
		t.Fatal("a certificate naming two roles has an identity")
	}
	// Another trust domain, or a malformed path, is not a tether identity.
	for _, path := range []string{"/worker/n1", "/worker/", "/worker/a/b", "/nobody/n1"} {
		u := *leaf.Cert.URIs[0]
		u.Path = path
		if path == "/worker/n1" {
			u.Host = "example.org"
		}
		cert.URIs = []*url.URL{&u}
		if id, ok := IdentityOf(&cert); ok {
			t.Errorf("%s%s: identity %v", u.Host, path, id)
		}
	}
}

func TestCAKeyRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if _, found, err := ReadCA(dir); found || err != nil {
		t.Fatalf("empty dir: found %v, %v", found, err)
	}
	ca := mustCA(t, "dev-ca")
	if err := ca.WriteCAKey(dir); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, "ca-key.pem")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("CA key mode: %v %v", st, err)
	}
	again, found, err := ReadCA(dir)
	if err != nil || !found {
		t.Fatalf("ReadCA: %v %v", found, err)
	}
	// A certificate issued by the reread CA verifies against the original.
	leaf := mustIssue(t, again, "n1", IssueOptions{Role: RoleEdge})
	if _, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatal(err)
	}
	// A key that is not the CA's is refused.
	other := mustCA(t, "other")
	if err := other.WriteCAKey(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), other.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadCA(dir); err == nil {
		t.Fatal("a CA certificate with another CA's key was accepted")
	}
}
