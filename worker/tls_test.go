package worker

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster/pki"
	"github.com/tether-project/tether/test/testhttp"
	"github.com/tether-project/tether/test/workertest"
)

type tlsFixture struct {
	ca  *pki.CA
	dir string
}

func newTLSFixture(t *testing.T) *tlsFixture {
	t.Helper()
	ca, err := pki.NewCA("worker-test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &tlsFixture{ca: ca, dir: t.TempDir()}
}

func (f *tlsFixture) issue(t *testing.T, id string, role pki.Role) (*pki.Leaf, pki.Files) {
	t.Helper()
	leaf, err := f.ca.Issue(id, pki.IssueOptions{Role: role})
	if err != nil {
		t.Fatal(err)
	}
	files, err := f.ca.WriteFiles(f.dir, id, leaf)
	if err != nil {
		t.Fatal(err)
	}
	return leaf, files
}

// client trusts the fixture's CA and presents leaf (nil: no certificate).
func (f *tlsFixture) client(t *testing.T, leaf *pki.Leaf) *http.Client {
	c := &tls.Config{RootCAs: f.ca.Pool(), MinVersion: tls.VersionTLS12}
	if leaf != nil {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &leaf.TLS, nil }
	}
	return testhttp.Client(t, c)
}

func TestTLSConfigKeys(t *testing.T) {
	f := newTLSFixture(t)
	_, files := f.issue(t, "w1", pki.RoleWorker)
	base := "instance_id: w1\nmodel: m\n"
	mutual := base + "tls:\n  mode: mutual\n  ca_file: " + files.CA + "\n  cert_file: " + files.Cert + "\n  key_file: " + files.Key + "\n"
	for _, key := range []string{"http_client_auth", "client_auth"} { // the edge's spelling, and the former one
		cfg, err := ParseConfig([]byte(mutual + "  " + key + ": verify_if_given\n  allowed_clients: [\"spiffe://tether/edge/*\"]\n"))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.TLS.Mode != TLSModeMutual || cfg.TLS.HTTPClientAuth != ClientAuthVerifyIfGiven || len(cfg.TLS.AllowedClients) != 1 {
			t.Fatalf("parsed %+v", cfg.TLS)
		}
		if d := cfg.Deprecated(); (key == "client_auth") != (len(d) == 1) {
			t.Fatalf("%s: warnings %q", key, d)
		}
	}
	// No tls section: plaintext with a warning; DefaultConfig states it.
	cfg, err := ParseConfig([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if w := (&workerTLS{cfg: cfg.TLS}).warnings(); cfg.TLS.Mode != "" || len(w) == 0 {
		t.Fatalf("no tls section: mode %q warnings %v", cfg.TLS.Mode, w)
	}
	if DefaultConfig().TLS.Mode != TLSModePlaintext {
		t.Fatal("DefaultConfig is not explicitly plaintext")
	}
	// Files are read by New: a missing one is an error naming the key.
	cfg, err = ParseConfig([]byte(strings.Replace(mutual, files.Cert, filepath.Join(f.dir, "nope.pem"), 1)))
	if err != nil {
		t.Fatalf("files are not read at parse time: %v", err)
	}
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "tls.cert_file") {
		t.Fatalf("New with a missing certificate: %v", err)
	}
	cases := []struct{ name, yaml, want string }{
		{"unknown mode", base + "tls: {mode: on}\n", "tls.mode, line 3: unknown value"},
		{"mutual without files", base + "tls: {mode: mutual}\n", "tls.ca_file, line 3: required"},
		{"files in plaintext mode", base + "tls: {mode: plaintext, ca_file: " + files.CA + "}\n", "tls.ca_file, line 3: set, but"},
		{"client auth unknown", mutual + "  http_client_auth: sometimes\n", "tls.http_client_auth, line 8: unknown value"},
		{"client auth without tls", base + "tls: {http_client_auth: require}\n", "tls.http_client_auth, line 3: client certificates need tls.mode: mutual"},
		{"bad pattern", mutual + "  allowed_clients: [\"a*b\"]\n", "tls.allowed_clients[0]"},
		{"plaintext advertise URL", mutual + "advertise_url: http://w1:9000\n", "advertise_url"},
		{"unknown key", base + "tls: {mode: plaintext, verify: true}\n", "tls.verify, line 3: unknown key"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(c.yaml))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
}

func startTLSServer(t *testing.T, f *tlsFixture, auth string, allowed ...string) *Server {
	t.Helper()
	_, files := f.issue(t, "w1", pki.RoleWorker)
	cfg := testConfig("w1")
	cfg.TLS = ServerTLSConfig{Mode: TLSModeMutual, CAFile: files.CA, CertFile: files.Cert, KeyFile: files.Key, HTTPClientAuth: auth, AllowedClients: allowed}
	s := workertest.Start(t, New, cfg)
	if !strings.HasPrefix(s.URL(), "https://") || s.TLSMode() != TLSModeMutual {
		t.Fatalf("URL %s, mode %s", s.URL(), s.TLSMode())
	}
	return s
}

func chatStatus(t *testing.T, c *http.Client, base string) (int, string) {
	t.Helper()
	resp, err := c.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"test-model","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestClientCertificatesRequired(t *testing.T) {
	f := newTLSFixture(t)
	s := startTLSServer(t, f, "", pki.IdentityURI(pki.RoleEdge, "*"))
	edgeLeaf, _ := f.issue(t, "edge-1", pki.RoleEdge)
	otherWorker, _ := f.issue(t, "w2", pki.RoleWorker)
	rogueCA, err := pki.NewCA("rogue", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	rogueEdge, err := rogueCA.Issue("edge-1", pki.IssueOptions{Role: pki.RoleEdge})
	if err != nil {
		t.Fatal(err)
	}
	expired, err := f.ca.Issue("edge-1", pki.IssueOptions{Role: pki.RoleEdge, NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if st, body := chatStatus(t, f.client(t, edgeLeaf), s.URL()); st != http.StatusOK {
		t.Fatalf("an edge's certificate: %d %s", st, body)
	}
	for name, leaf := range map[string]*pki.Leaf{"no certificate": nil, "another CA": rogueEdge, "expired": expired, "a worker's certificate": otherWorker} {
		c := f.client(t, leaf)
		if st, body := chatStatus(t, c, s.URL()); st != 0 {
			t.Errorf("%s: answered %d %s", name, st, body)
		}
		if resp, err := c.Get(s.URL() + "/healthz"); err == nil {
			resp.Body.Close()
			t.Errorf("%s: /healthz answered with client_auth require", name)
		}
	}
	// Plain HTTP gets the TLS server's 400, never the API.
	if st, _ := chatStatus(t, testClient(t), strings.Replace(s.URL(), "https://", "http://", 1)); st != http.StatusBadRequest {
		t.Errorf("plain HTTP: %d", st)
	}
}

// verify_if_given: probes and scrapers without certificates reach
// /healthz, /readyz and /metrics; the API needs a certificate (401 OpenAI
// error without one); a presented certificate is still checked.
func TestClientCertificatesVerifyIfGiven(t *testing.T) {
	f := newTLSFixture(t)
	s := startTLSServer(t, f, ClientAuthVerifyIfGiven, pki.IdentityURI(pki.RoleEdge, "*"))
	anon := f.client(t, nil)
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := anon.Get(s.URL() + path)
		if err != nil {
			t.Fatalf("%s without a certificate: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s without a certificate: %d", path, resp.StatusCode)
		}
	}
	for _, path := range []string{"/v1/chat/completions", "/v1/models"} {
		resp, err := anon.Get(s.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Error struct{ Type, Code string } `json:"error"`
		}
		if resp.StatusCode != http.StatusUnauthorized || json.Unmarshal(b, &e) != nil || e.Error.Code != "client_certificate_required" {
			t.Fatalf("%s without a certificate: %d %s", path, resp.StatusCode, b)
		}
	}
	edgeLeaf, _ := f.issue(t, "edge-1", pki.RoleEdge)
	if st, body := chatStatus(t, f.client(t, edgeLeaf), s.URL()); st != http.StatusOK {
		t.Fatalf("an edge's certificate: %d %s", st, body)
	}
	workerLeaf, _ := f.issue(t, "w2", pki.RoleWorker)
	if st, body := chatStatus(t, f.client(t, workerLeaf), s.URL()); st != 0 {
		t.Fatalf("a worker's certificate (not an allowed client): %d %s", st, body)
	}
}
