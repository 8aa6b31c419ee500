package edge

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-project/tether/cluster/pki"
)

// New validates the configuration it is given (edge/config's rules) and
// refuses what Validate refuses, naming the key.
func TestNewRefusesAnInvalidConfiguration(t *testing.T) {
	c := DefaultConfig() // no model, no servers, no cluster section
	if _, err := New(c, Deps{}); err == nil || !strings.Contains(err.Error(), "edge: config: ") || !strings.Contains(err.Error(), "model") {
		t.Fatalf("New: %v, want the configuration's errors, the model's among them", err)
	}
}

// The certificate files are read by New (not when the configuration is
// parsed): a missing one is an error naming its key.
func TestNewReadsTheCertificateFiles(t *testing.T) {
	p := newTestPKI(t)
	f := p.files(t, "e1", pki.RoleEdge)
	t.Setenv(EnvInternalRequestAuthKey, "")
	t.Setenv(EnvClusterAuthKey, "")
	cfg, err := ParseConfig([]byte(`model: m
internal_request_auth_key: "0123456789abcdef0123"
context_servers: {urls: ["https://127.0.0.1:9001"]}
generation_servers: {urls: ["https://127.0.0.1:9002"]}
cluster: {node_id: e1, data_dir: /tmp/tether-never-opened, bootstrap: true, peers: [{id: e1, addr: "127.0.0.1:7400"}]}
tls: {mode: mutual, ca_file: ` + f.CA + `, cert_file: ` + f.Cert + `, key_file: ` + filepath.Join(p.dir, "nope.pem") + `}
`))
	if err != nil {
		t.Fatalf("files are not read at parse time: %v", err)
	}
	if _, err := New(cfg, Deps{Logger: testLogger(t)}); err == nil || !strings.Contains(err.Error(), "tls.key_file") {
		t.Fatalf("New with a missing key file: %v", err)
	}
}
