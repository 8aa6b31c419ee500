package routing

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestParseRouterType(t *testing.T) {
	cases := map[string]RouterType{
		"":               RouterConversation,
		"conversation":   RouterConversation,
		" Round_Robin ":  RouterRoundRobin,
		"load_balancing": RouterLoadBalancing,
		"kv_cache_aware": RouterKVCacheAware,
	}
	for in, want := range cases {
		got, err := ParseRouterType(in)
		if err != nil || got != want {
			t.Errorf("ParseRouterType(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	_, err := ParseRouterType("random")
	if err == nil || !strings.Contains(err.Error(), "router.type") || !strings.Contains(err.Error(), "kv_cache_aware") {
		t.Fatalf("unknown type error must name the key and the allowed values: %v", err)
	}
	var cfg struct {
		Type  RouterType `json:"type"`
		Scope Scope      `json:"scope"`
	}
	if err := json.Unmarshal([]byte(`{"type":"kv_cache_aware","scope":"both"}`), &cfg); err != nil || cfg.Type != RouterKVCacheAware || cfg.Scope != ScopeBoth {
		t.Fatalf("text unmarshal: %+v %v", cfg, err)
	}
	if err := json.Unmarshal([]byte(`{"type":"nope"}`), &cfg); err == nil {
		t.Fatal("unknown type accepted through UnmarshalText")
	}
	if b, _ := json.Marshal(RouterRoundRobin); string(b) != `"round_robin"` {
		t.Fatalf("marshal: %s", b)
	}
}

func TestParseScope(t *testing.T) {
	for in, want := range map[string]Scope{"": ScopeContext, "context": ScopeContext, "BOTH": ScopeBoth} {
		if got, err := ParseScope(in); err != nil || got != want {
			t.Errorf("ParseScope(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseScope("generation"); err == nil || !strings.Contains(err.Error(), "subagent_affinity_scope") {
		t.Fatalf("unknown scope: %v", err)
	}
}

func TestParsePriority(t *testing.T) {
	for in, want := range map[string]Priority{"": PriorityNormal, " Interactive": PriorityInteractive, "background": PriorityBackground, "BATCH": PriorityBackground} {
		if got, err := ParsePriority(in); err != nil || got != want {
			t.Errorf("ParsePriority(%q) = %v, %v", in, got, err)
		}
	}
	// Unknown values are refused (the edge answers 400).
	if _, err := ParsePriority("urgent"); !errors.Is(err, ErrUnknownPriority) {
		t.Fatalf("unknown priority: %v", err)
	}
	h := http.Header{}
	h.Set("x-tether-priority", "high")
	if _, err := PriorityFromHeader(h); err == nil || !strings.Contains(err.Error(), PriorityHeader) || !strings.Contains(err.Error(), "interactive, batch, background") {
		t.Fatalf("header error must name the header and the allowed values: %v", err)
	}
	h.Set("x-tether-priority", "background")
	if p, err := PriorityFromHeader(h); err != nil || p != PriorityBackground {
		t.Fatalf("header: %v %v", p, err)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	cases := []struct {
		mutate  func(*Config)
		wantKey string
	}{
		{func(c *Config) { c.Type = 9 }, "router.type"},
		{func(c *Config) { c.BlockSize = 0 }, "router.block_size"},
		{func(c *Config) { c.PredictTTL = -time.Second }, "router.predict_ttl"},
		{func(c *Config) { c.Weights.Cache = -1 }, "router.weights.cache"},
		{func(c *Config) { c.Weights.Queue = math.NaN() }, "router.weights.queue"},
		{func(c *Config) { c.Weights.Decode = math.Inf(1) }, "router.weights.decode"},
		{func(c *Config) { c.Weights.InteractiveQueueFactor = 0.5 }, "router.weights.interactive_queue_factor"},
		{func(c *Config) { c.Weights.BackgroundCacheFactor = 0 }, "router.weights.background_cache_factor"},
		{func(c *Config) { c.Overflow.QueuedRequests = -1 }, "router.overflow.queued_requests"},
		{func(c *Config) { c.Overflow.QueuedRequests, c.Shed.MaxQueuedRequests = 64, 64 }, "router.overflow.queued_requests"},
		{func(c *Config) { c.Overflow.ActivePromptTokens = -1 }, "router.overflow.active_prompt_tokens"},
		{func(c *Config) { c.Overflow.RebindAfter = -1 }, "router.overflow.rebind_after"},
		{func(c *Config) { c.Shed.MaxQueuedPrefillTokens = -5 }, "router.shed.max_queued_prefill_tokens"},
		{func(c *Config) { c.Shed.MaxQueuedRequests = -1 }, "router.shed.max_queued_requests"},
		{func(c *Config) { c.Shed.MaxBacklogSeconds = -1 }, "router.shed.max_backlog_seconds"},
		{func(c *Config) { c.Shed.MaxBacklogSeconds = math.NaN() }, "router.shed.max_backlog_seconds"},
		{func(c *Config) { c.Shed.MaxBacklogSeconds = math.Inf(1) }, "router.shed.max_backlog_seconds"},
		{func(c *Config) { c.Shed.PrefillTokensPerSecond = 0 }, "router.shed.prefill_tokens_per_second"},
		{func(c *Config) { c.Shed.RetryAfterMin = 1500 * time.Millisecond }, "router.shed.retry_after_min"},
		{func(c *Config) { c.Shed.RetryAfterMax = 0 }, "router.shed.retry_after_max"},
		{func(c *Config) { c.Breaker.OpenBelow = -0.1 }, "router.circuit_breaker.open_below"},
	}
	for _, c := range cases {
		cfg := DefaultConfig()
		c.mutate(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.wantKey) {
			t.Errorf("want an error naming %s, got %v", c.wantKey, err)
		}
		if _, err := NewRouter(cfg); err == nil {
			t.Errorf("%s: NewRouter accepted an invalid config", c.wantKey)
		}
	}
	// Disabling limits (0) is valid.
	cfg := DefaultConfig()
	cfg.Overflow = OverflowConfig{}
	cfg.Shed.MaxQueuedRequests, cfg.Shed.MaxBacklogSeconds = 0, 0
	if err := cfg.Validate(); err != nil {
		t.Fatalf("disabled thresholds: %v", err)
	}
}

func TestNewViewsRejectsBadInput(t *testing.T) {
	if _, err := NewViews([]InstanceView{{ID: "a", Fleet: 1}, {ID: "a", Fleet: 2}}); err == nil || !strings.Contains(err.Error(), "duplicate") {
		t.Fatalf("duplicate id: %v", err)
	}
	if _, err := NewViews([]InstanceView{{ID: "", Fleet: 1}}); err == nil {
		t.Fatal("empty id accepted")
	}
	if _, err := NewViews([]InstanceView{{ID: "a", Fleet: 0}}); err == nil {
		t.Fatal("invalid fleet accepted")
	}
	var nilViews *Views
	if _, ok := nilViews.Lookup("a"); ok || nilViews.Fleet(1) != nil || nilViews.Len() != 0 {
		t.Fatal("nil views must be empty")
	}
	v, err := NewViews([]InstanceView{{ID: "g1", Fleet: 2}, {ID: "c2", Fleet: 1}, {ID: "c1", Fleet: 1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := v.Fleet(1)
	if len(ctx) != 2 || ctx[0].ID != "c1" || ctx[1].ID != "c2" || len(v.Fleet(2)) != 1 {
		t.Fatalf("fleet index: %+v / %+v", ctx, v.Fleet(2))
	}
}
