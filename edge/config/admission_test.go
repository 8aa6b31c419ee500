package config

import (
	"strings"
	"testing"
	"time"
)

// The admission section's values are checked with the key named.
func TestAdmissionConfigErrorsNameTheKey(t *testing.T) {
	t.Setenv(EnvInternalRequestAuthKey, "")
	base := "model: m\ncontext_servers: {urls: [http://a:1]}\ngeneration_servers: {urls: [http://b:1]}\ncluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789}\n"
	for _, c := range []struct{ yaml, key string }{
		{"admission: {max_inflight: -1}", "admission.max_inflight"},
		{"admission: {max_inflight: 4, min_inflight: 5}", "admission.min_inflight"},
		{"admission: {retry_after: -1s}", "admission.retry_after"},
		{"admission: {min_cpu_share: 1.5}", "admission.min_cpu_share"},
		{"admission: {min_cpu_share: .nan}", "admission.min_cpu_share"},
	} {
		if _, err := ParseConfig([]byte(base + c.yaml + "\n")); err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%s: error %v, want one naming %s", c.yaml, err, c.key)
		}
	}
	cfg, err := ParseConfig([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultAdmissionConfig()
	want.MaxSchedulingLatency = cfg.Cluster.Raft.LeaderLeaseTimeout / SchedulingLatencyLeaseShare
	if cfg.Admission != want || want.MaxSchedulingLatency != 200*time.Millisecond || want.MinCPUShare != 0.5 {
		t.Errorf("defaults %+v, want %+v (a fifth of the shipped 1 s lease)", cfg.Admission, want)
	}
	// The bound follows a lease the file sets; a bound the file sets stays.
	for _, c := range []struct {
		yaml string
		want time.Duration
	}{
		{"cluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789, raft: {heartbeat_timeout: 500ms, leader_lease_timeout: 250ms}}\n", 50 * time.Millisecond},
		{"cluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789}\nadmission: {max_scheduling_latency: 30ms}\n", 30 * time.Millisecond},
	} {
		y := strings.Replace(base, "cluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789}\n", c.yaml, 1)
		cfg, err := ParseConfig([]byte(y))
		if err != nil {
			t.Fatalf("%s: %v", c.yaml, err)
		}
		if cfg.Admission.MaxSchedulingLatency != c.want {
			t.Errorf("%s: max_scheduling_latency %s, want %s", c.yaml, cfg.Admission.MaxSchedulingLatency, c.want)
		}
	}
}
