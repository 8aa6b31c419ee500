package worker

import (
	"testing"

	"github.com/tether-project/tether/internal/telemetry"
)

// The load report says what the worker's KV events reflect, so the edge's
// /admin/v1/instances can tell a simulated cache from an engine's events
// and from a proxy that publishes none.
func TestKVSourceInLoadReport(t *testing.T) {
	for _, c := range []struct {
		engine EngineConfig
		want   string
	}{
		{EngineConfig{Type: "sim"}, ""},
		{EngineConfig{Type: "proxy", KVEvents: KVEventsConfig{Format: "vllm"}}, telemetry.KVSourceEngineEvents},
		{EngineConfig{Type: "proxy"}, telemetry.KVSourceNone},
	} {
		s := &Server{cfg: Config{Engine: c.engine}}
		if got := s.kvSource(); got != c.want {
			t.Errorf("engine %+v: kv_source %q, want %q", c.engine.Type, got, c.want)
		}
	}
}
