package config

import (
	"strings"
	"testing"
	"time"
)

// The flow_control section: off by default with its defaults filled in,
// and each bad value refused with its key and line.
func TestFlowConfigDefaultsAndErrors(t *testing.T) {
	t.Setenv(EnvInternalRequestAuthKey, "")
	base := "model: m\ncontext_servers: {urls: [http://a:1]}\ngeneration_servers: {urls: [http://b:1]}\ncluster: {node_id: e1, data_dir: /tmp/x, auth_key: cluster-key-0123456789}\n"
	cfg, err := ParseConfig([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.FlowControl != DefaultFlowConfig() || cfg.FlowControl.Enabled {
		t.Errorf("defaults %+v, want %+v (off)", cfg.FlowControl, DefaultFlowConfig())
	}
	cfg, err = ParseConfig([]byte(base + "flow_control: {enabled: true, interactive: {max_wait: 3s}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.FlowControl.Enabled || cfg.FlowControl.Interactive.MaxWait != 3*time.Second ||
		cfg.FlowControl.Interactive.MaxQueued != DefaultInteractiveMaxQueue || cfg.FlowControl.Batch != DefaultFlowConfig().Batch {
		t.Errorf("a partial section %+v: the keys it sets, the defaults for the rest", cfg.FlowControl)
	}
	for _, c := range []struct{ yaml, want string }{
		{"flow_control: {queue_per_rank: -1}", "flow_control.queue_per_rank, line 5: must be in 1..1024, got -1"},
		{"flow_control: {fairness: bytes}", `flow_control.fairness, line 5: "bytes" is not one of "tokens", "requests"`},
		{"flow_control: {tenant_header: \"x tenant\"}", `flow_control.tenant_header, line 5: "x tenant" is not an HTTP header name`},
		{"flow_control: {tenant_header: Authorization}", `flow_control.tenant_header, line 5: "Authorization" is read by the edge`},
		{"flow_control: {interactive: {max_wait: -1s}}", "flow_control.interactive.max_wait, line 5: must be in (0, 10m0s], got -1s"},
		{"flow_control: {batch: {max_wait: 11m}}", "flow_control.batch.max_wait, line 5: must be in (0, 10m0s], got 11m0s"},
		{"flow_control: {batch: {max_queued: -3}}", "flow_control.batch.max_queued, line 5: must be > 0, got -3"},
		{"admission: {max_inflight: 100}\nflow_control: {enabled: true, interactive: {max_queued: 90}, batch: {max_queued: 20}}",
			"flow_control.interactive.max_queued, line 6: with flow_control.batch.max_queued: 110 queued requests exceed admission.max_inflight (100)"},
	} {
		_, err := ParseConfig([]byte(base + c.yaml + "\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.yaml, err, c.want)
		}
	}
}
