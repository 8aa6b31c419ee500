package config

import (
	"strings"
	"testing"
)

// FuzzParseConfig (added by the reliability suite): any YAML either parses
// into a configuration that validates again unchanged, or is refused with a
// non-empty message; nothing panics.
func FuzzParseConfig(f *testing.F) {
	valid := `model: m
internal_request_auth_key: "0123456789abcdef0123"
context_servers:
  urls: ["http://127.0.0.1:9001", {name: w2, url: "http://127.0.0.1:9003"}]
generation_servers:
  urls: ["http://127.0.0.1:9002"]
  router: {type: kv_cache_aware}
conversation_affinity_header_for_subagents: X-Dynamo-Parent-Session-ID
trusted_gateway: {enabled: true, cidrs: ["10.0.0.0/8"]}
cluster:
  node_id: e1
  data_dir: /tmp/never-opened
  bind_addr: 127.0.0.1:7400
  bootstrap: true
  peers: [{id: e1, addr: "127.0.0.1:7400"}]
  raft: {heartbeat_timeout: 500ms}
nats: {urls: ["nats://127.0.0.1:4222"], user: u, password: p}
`
	f.Add(valid)
	f.Add(strings.Replace(valid, "bootstrap: true", "join: [\"127.0.0.1:7401\"]", 1))
	f.Add("model: [1, 2]\n")
	f.Add("colour: blue\n")
	f.Add("session_ttl: -5s\nmax_bindings: 0\n")
	f.Add("{{{{")
	f.Add("")
	f.Add("context_servers: {urls: [{name: \"a.b\", url: \"ftp://x\"}]}\n")
	f.Fuzz(func(t *testing.T, data string) {
		t.Setenv(EnvAdminToken, "")
		cfg, err := ParseConfig([]byte(data))
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("empty error message for %q", data)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("a parsed config no longer validates: %v\n%s", err, data)
		}
	})
}
