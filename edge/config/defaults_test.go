package config

import (
	"testing"
	"time"
)

// cluster.propose_timeout defaults to the election timeout (a healthy
// cluster under load commits within it); a set value is kept.
func TestProposeTimeoutDerivesFromRaftTiming(t *testing.T) {
	t.Setenv(EnvInternalRequestAuthKey, "")
	for _, c := range []struct {
		raft string
		want time.Duration
	}{
		{"", time.Second},
		{", raft: {election_timeout: 2s}", 2 * time.Second},
		{", raft: {heartbeat_timeout: 1s}", time.Second},
		{", raft: {election_timeout: 1500ms}, propose_timeout: 300ms", 300 * time.Millisecond},
	} {
		cfg, err := ParseConfig([]byte(`
model: m
context_servers: {urls: [http://a:1]}
generation_servers: {urls: [http://b:1]}
cluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789` + c.raft + `}
`))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Cluster.ProposeTimeout != c.want {
			t.Errorf("cluster {%s}: propose_timeout %s, want %s", c.raft, cfg.Cluster.ProposeTimeout, c.want)
		}
	}
}
