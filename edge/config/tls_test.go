package config

import (
	"path/filepath"
	"strings"
	"testing"
)

// With tls.worker_server_name (one certificate shared by all workers)
// there is no per-instance identity to check; in plaintext there is no
// TLS at all.
func TestWorkerIdentityCheckedOnlyWithPerWorkerCertificates(t *testing.T) {
	for _, c := range []struct {
		tls  TLSConfig
		want bool
	}{
		{TLSConfig{Mode: TLSModeMutual}, true},
		{TLSConfig{Mode: TLSModeMutual, WorkerServerName: "tether-worker"}, false},
		{TLSConfig{Mode: TLSModePlaintext}, false},
	} {
		if got := c.tls.ChecksWorkerIdentity(); got != c.want {
			t.Errorf("%+v: checks worker identity %v, want %v", c.tls, got, c.want)
		}
	}
}

func TestTLSConfigValidation(t *testing.T) {
	// The files are read by the edge (edge/edgetls), never here: they need
	// not exist.
	dir := t.TempDir()
	f := struct{ CA, Cert, Key string }{filepath.Join(dir, "ca.pem"), filepath.Join(dir, "e1.pem"), filepath.Join(dir, "e1-key.pem")}
	base := `model: m
internal_request_auth_key: "0123456789abcdef0123"
context_servers: {urls: ["https://127.0.0.1:9001"]}
generation_servers: {urls: ["https://127.0.0.1:9002"]}
cluster: {node_id: e1, data_dir: /tmp/tether-never-opened, bootstrap: true, peers: [{id: e1, addr: "127.0.0.1:7400"}]}
`
	mutual := base + "tls: {mode: mutual, ca_file: " + f.CA + ", cert_file: " + f.Cert + ", key_file: " + f.Key + "}\n"
	t.Setenv(EnvInternalRequestAuthKey, "")
	t.Setenv(EnvClusterAuthKey, "")
	cfg, err := ParseConfig([]byte(mutual))
	if err != nil {
		t.Fatalf("mutual: %v", err)
	}
	if !cfg.TLS.Mutual() || !cfg.TLS.HTTPTLS() {
		t.Fatalf("mutual config: %+v", cfg.TLS)
	}
	// No tls section: plaintext, with a warning at startup.
	cfg, err = ParseConfig([]byte(base))
	if err != nil {
		t.Fatalf("no tls section: %v", err)
	}
	if cfg.TLS.Mode != "" {
		t.Fatalf("no tls section: mode %q", cfg.TLS.Mode)
	}
	if d := DefaultConfig(); d.TLS.Mode != TLSModePlaintext {
		t.Fatalf("DefaultConfig tls.mode %q, want plaintext stated", d.TLS.Mode)
	}
	cases := []struct{ name, yaml, key string }{
		{"unknown mode", base + "tls: {mode: tls}\n", "tls.mode"},
		{"mutual without files", base + "tls: {mode: mutual}\n", "tls.ca_file"},
		{"files in plaintext mode", base + "tls: {mode: plaintext, cert_file: " + f.Cert + "}\n", "tls.cert_file"},
		{"http listener unknown", strings.Replace(mutual, "mode: mutual", "mode: mutual, http: ssl", 1), "tls.http"},
		{"client auth unknown", strings.Replace(mutual, "mode: mutual", "mode: mutual, http_client_auth: maybe", 1), "tls.http_client_auth"},
		{"client auth on plaintext listener", strings.Replace(mutual, "mode: mutual", "mode: mutual, http: plaintext, http_client_auth: require", 1), "tls.http_client_auth"},
		{"worker server name without tls", base + "tls: {mode: plaintext, worker_server_name: w}\n", "tls.worker_server_name"},
		{"plaintext worker URL in mutual mode", strings.Replace(mutual, "https://127.0.0.1:9001", "http://127.0.0.1:9001", 1), "context_servers.urls[0]"},
		{"nats tls without nats", base + "nats: {tls: {ca_file: " + f.CA + "}}\n", "nats.tls"},
		{"nats tls cert without key", base + "nats: {urls: [\"tls://127.0.0.1:4222\"], tls: {cert_file: " + f.Cert + "}}\n", "nats.tls.cert_file"},
		{"nats tls with embedded", base + "nats: {embedded: true, tls: {ca_file: " + f.CA + "}}\n", "nats.tls"},
		{"worker users without embedded", base + "nats: {urls: [\"nats://127.0.0.1:4222\"], worker_users: [{instance: w1, password: 0123456789abcdef}]}\n", "nats.worker_users"},
		{"worker users without the edge's user", base + "nats: {embedded: true, worker_users: [{instance: w1, password: 0123456789abcdef}]}\n", "nats.user"},
		{"worker user short password", base + "nats: {embedded: true, user: edge, password: edge-password-0123, worker_users: [{instance: w1, password: short}]}\n", "nats.worker_users[0].password"},
		{"worker user bad instance", base + "nats: {embedded: true, user: edge, password: edge-password-0123, worker_users: [{instance: a.b, password: 0123456789abcdef}]}\n", "nats.worker_users[0].instance"},
		{"worker users with mutual tls", strings.Replace(mutual, "context_servers", "nats: {embedded: true, user: edge, password: edge-password-0123, worker_users: [{instance: w1, password: 0123456789abcdef}]}\ncontext_servers", 1), "nats.worker_users"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(c.yaml))
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), c.key) {
				t.Fatalf("error does not name %s: %v", c.key, err)
			}
		})
	}
}
