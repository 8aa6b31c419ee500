package reliability

import (
	"strings"
	"testing"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/worker"
)

const validEdgeYAML = `model: m
internal_request_auth_key: "0123456789abcdef0123"
context_servers:
  urls: ["http://127.0.0.1:9001"]
generation_servers:
  urls: ["http://127.0.0.1:9002"]
cluster:
  node_id: e1
  data_dir: /tmp/tether-reliability-never-opened
  bind_addr: 127.0.0.1:7400
  bootstrap: true
  peers: [{id: e1, addr: "127.0.0.1:7400"}]
  auth_key: "0123456789abcdef0123"
`

// Every invalid combination is refused with a message naming the key.
// (The owners' packages test their validation in detail; this catalogue
// pins the operator-facing contract across edge and worker.)
func TestEdgeConfigErrorsNameTheKey(t *testing.T) {
	if _, err := edge.ParseConfig([]byte(validEdgeYAML)); err != nil {
		t.Fatalf("baseline config rejected: %v", err)
	}
	cases := []struct {
		name, yaml, key string
	}{
		{"unknown key", validEdgeYAML + "colour: blue\n", "colour"},
		{"not YAML", "model: [unclosed", "YAML"},
		{"wrong type", strings.Replace(validEdgeYAML, "model: m", "model: [1, 2]", 1), "model, line 1: want a string"}, // the key, not only the line
		{"wrong nested type", strings.Replace(validEdgeYAML, `  urls: ["http://127.0.0.1:9002"]`, "  urls: [\"http://127.0.0.1:9002\"]\n  router: {type: [conversation]}", 1), "generation_servers.router.type"},
		{"no model", strings.Replace(validEdgeYAML, "model: m\n", "", 1), "model"},
		{"port out of range", validEdgeYAML + "port: 70000\n", "port"},
		{"short internal key", strings.Replace(validEdgeYAML, `internal_request_auth_key: "0123456789abcdef0123"`, `internal_request_auth_key: "short"`, 1), "internal_request_auth_key"},
		{"parent header without a signing key", strings.Replace(validEdgeYAML, `internal_request_auth_key: "0123456789abcdef0123"`, `conversation_affinity_header_for_subagents: X-Parent`, 1), "internal_request_auth_key"},
		{"scope both without conversation router", strings.Replace(validEdgeYAML, `  urls: ["http://127.0.0.1:9002"]`, "  urls: [\"http://127.0.0.1:9002\"]\n  router: {type: kv_cache_aware}", 1) + "subagent_affinity_scope: both\n", "subagent_affinity_scope"},
		{"negative retries", validEdgeYAML + "max_retries: -1\n", "max_retries"},
		{"zero session ttl", validEdgeYAML + "session_ttl: 0s\n", "session_ttl"},
		{"short admin token", validEdgeYAML + "admin_token: abc\n", "admin_token"},
		{"bad worker URL", strings.Replace(validEdgeYAML, "http://127.0.0.1:9001", "ftp://x", 1), "context_servers.urls[0]"},
		{"duplicate worker URL", strings.Replace(validEdgeYAML, `["http://127.0.0.1:9001"]`, `["http://127.0.0.1:9001", "http://127.0.0.1:9001/"]`, 1), "context_servers.urls[1]"},
		{"no workers and no nats", strings.Replace(validEdgeYAML, `  urls: ["http://127.0.0.1:9002"]`, "  num_instances: 1", 1), "generation_servers.urls"},
		{"gateway without cidrs or token", strings.Replace(validEdgeYAML, "model: m", "model: m\nconversation_affinity_header_for_subagents: X-Parent\ntrusted_gateway: {enabled: true}", 1), "trusted_gateway"},
		{"gateway bad cidr", strings.Replace(validEdgeYAML, "model: m", "model: m\nconversation_affinity_header_for_subagents: X-Parent\ntrusted_gateway: {enabled: true, cidrs: [\"10.0.0.0/99\"]}", 1), "trusted_gateway.cidrs[0]"},
		{"no node id", strings.Replace(validEdgeYAML, "  node_id: e1\n", "", 1), "cluster.node_id"},
		{"no data dir", strings.Replace(validEdgeYAML, "  data_dir: /tmp/tether-reliability-never-opened\n", "", 1), "cluster.data_dir"},
		{"bootstrap and join", strings.Replace(validEdgeYAML, "  bootstrap: true", "  bootstrap: true\n  join: [\"127.0.0.1:7401\"]", 1), "cluster.join"},
		{"peers without self", strings.Replace(validEdgeYAML, "{id: e1,", "{id: e2,", 1), "cluster.peers"},
		{"duplicate peer", strings.Replace(validEdgeYAML, `peers: [{id: e1, addr: "127.0.0.1:7400"}]`, `peers: [{id: e1, addr: "127.0.0.1:7400"}, {id: e1, addr: "127.0.0.1:7401"}]`, 1), "cluster.peers[1].id"},
		{"bad bind addr", strings.Replace(validEdgeYAML, "bind_addr: 127.0.0.1:7400", "bind_addr: nonsense", 1), "cluster.bind_addr"},
		{"short cluster key", strings.Replace(validEdgeYAML, `  auth_key: "0123456789abcdef0123"`, `  auth_key: "k"`, 1), "cluster.auth_key"},
		{"nats embedded and urls", validEdgeYAML + "nats: {embedded: true, urls: [\"nats://127.0.0.1:4222\"]}\n", "nats"},
		{"nats bad url", validEdgeYAML + "nats: {urls: [\"127.0.0.1:4222\"]}\n", "nats.urls[0]"},
		{"nats url of another scheme", validEdgeYAML + "nats: {urls: [\"http://127.0.0.1:4222\"]}\n", "nats.urls[0]"},
		{"nats password without user", validEdgeYAML + "nats: {urls: [\"nats://127.0.0.1:4222\"], password: p}\n", "nats.user"},
		{"otlp exporter without endpoint", validEdgeYAML + "tracing: {exporter: otlp}\n", "tracing.endpoint"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("TETHER_INTERNAL_REQUEST_AUTH_KEY", "")
			t.Setenv("TETHER_CLUSTER_AUTH_KEY", "")
			t.Setenv("TETHER_ADMIN_TOKEN", "")
			_, err := edge.ParseConfig([]byte(c.yaml))
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), c.key) {
				t.Fatalf("error does not name %q: %v", c.key, err)
			}
		})
	}
}

func TestWorkerConfigErrorsNameTheKey(t *testing.T) {
	base := "instance_id: w1\nmodel: m\n"
	if _, err := worker.ParseConfig([]byte(base)); err != nil {
		t.Fatalf("baseline config rejected: %v", err)
	}
	cases := []struct{ name, yaml, key string }{
		{"no instance id", "model: m\n", "instance_id"},
		{"instance id with a dot", "instance_id: w.1\nmodel: m\n", "instance_id"},
		{"no model", "instance_id: w1\n", "model"},
		{"unknown key", base + "colour: blue\n", "colour"},
		{"bad fleet", base + "fleet: both\n", "fleet"},
		{"bad role", base + "server_role: leader\n", "server_role"},
		{"port out of range", base + "port: -1\n", "port"},
		{"short auth key", base + "internal_request_auth_key: abc\n", "internal_request_auth_key"},
		{"bad engine", base + "engine: {type: gpu}\n", "engine"},
		{"nats credentials without url", base + "nats: {user: u, password: p}\n", "nats"},
		{"nats cert without key", base + "nats: {url: \"nats://127.0.0.1:4222\", tls: {cert_file: c.pem}}\n", "nats.tls.cert_file"},
		{"nats bad url", base + "nats: {url: \"http://x\"}\n", "nats.url"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(worker.EnvInternalRequestAuthKey, "")
			_, err := worker.ParseConfig([]byte(c.yaml))
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), c.key) {
				t.Fatalf("error does not name %q: %v", c.key, err)
			}
		})
	}
}
