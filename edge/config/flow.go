package config

import (
	"net/http"
	"strings"
	"time"
)

// FlowConfig is the flow_control section: fair, fleet-wide admission
// (edge/flow; edge/DESIGN.md "Fair admission across the fleet",
// docs/operations.md "Fair admission").
type FlowConfig struct {
	// Enabled holds the requests the fleet cannot start at once in a
	// queue at the edge, served fairly across tenants and by band, and
	// sheds (429, or 529 on /v1/messages) what would wait beyond its
	// band's bound. Off: requests go straight to the engines, as before;
	// tenants and bands are still counted (tether_edge_flow_*).
	Enabled bool `yaml:"enabled"`
	// TenantHeader names the request's tenant (default x-tether-tenant).
	// With trusted_gateway enabled it is removed from requests that do
	// not come from the gateway, as the sub-agent headers are. Without
	// it, the tenant is a keyed hash of the request's API key
	// (Authorization: Bearer, or x-api-key), else "default".
	TenantHeader string `yaml:"tenant_header"`
	// QueuePerRank is how many requests may wait inside one engine rank
	// (its own queue, beyond what it runs) before the edge holds the
	// rest: an instance's in-flight limit is what it reports running plus
	// this many per rank. Enough to keep the rank busy between the edge's
	// looks at its load; every request beyond it waits at the edge, where
	// the order is fair.
	QueuePerRank int `yaml:"queue_per_rank"`
	// Fairness is what a tenant's share counts: tokens (default: prompt
	// tokens plus a fixed cost per request, so a tenant of long prompts
	// does not get more of the engines' time by sending them) or requests.
	Fairness string `yaml:"fairness"`
	// Interactive and Batch are the two bands: interactive (the default)
	// is served first; batch (x-tether-priority: batch or background, or
	// service_tier: flex) waits behind it.
	Interactive BandConfig `yaml:"interactive"`
	Batch       BandConfig `yaml:"batch"`
}

// BandConfig bounds one band's queue on each edge.
type BandConfig struct {
	// MaxWait is the longest a request of the band waits at the edge;
	// one that would wait longer is shed with a Retry-After saying when
	// the queue ahead of it will have drained.
	MaxWait time.Duration `yaml:"max_wait"`
	// MaxQueued bounds the band's requests queued on one edge per model
	// (each holds its body meanwhile); beyond it a request is shed.
	MaxQueued int `yaml:"max_queued"`
}

// Flow control defaults and bounds.
const (
	DefaultTenantHeader        = "x-tether-tenant"
	DefaultQueuePerRank        = 2
	FairnessTokens             = "tokens"
	FairnessRequests           = "requests"
	DefaultInteractiveMaxWait  = 15 * time.Second
	DefaultBatchMaxWait        = 2 * time.Minute
	DefaultInteractiveMaxQueue = 1024
	DefaultBatchMaxQueue       = 1024
	// MaxFlowWait bounds max_wait: past ten minutes the agents' SDKs have
	// given up on the request (their default timeout).
	MaxFlowWait     = 10 * time.Minute
	MaxQueuePerRank = 1024
)

// DefaultFlowConfig is the flow_control section's defaults (off).
func DefaultFlowConfig() FlowConfig {
	return FlowConfig{
		TenantHeader: DefaultTenantHeader,
		QueuePerRank: DefaultQueuePerRank,
		Fairness:     FairnessTokens,
		Interactive:  BandConfig{MaxWait: DefaultInteractiveMaxWait, MaxQueued: DefaultInteractiveMaxQueue},
		Batch:        BandConfig{MaxWait: DefaultBatchMaxWait, MaxQueued: DefaultBatchMaxQueue},
	}
}

// withDefaults fills the zero keys with DefaultFlowConfig's values.
func (f *FlowConfig) withDefaults() {
	d := DefaultFlowConfig()
	if f.TenantHeader == "" {
		f.TenantHeader = d.TenantHeader
	}
	if f.QueuePerRank == 0 {
		f.QueuePerRank = d.QueuePerRank
	}
	if f.Fairness == "" {
		f.Fairness = d.Fairness
	}
	for _, b := range []struct{ b, d *BandConfig }{{&f.Interactive, &d.Interactive}, {&f.Batch, &d.Batch}} {
		if b.b.MaxWait == 0 {
			b.b.MaxWait = b.d.MaxWait
		}
		if b.b.MaxQueued == 0 {
			b.b.MaxQueued = b.d.MaxQueued
		}
	}
}

// reservedHeaders may not name the tenant: the edge reads or strips them
// for other purposes.
var reservedHeaders = []string{"authorization", "x-api-key", "content-type", "content-length", "host",
	"x-tether-priority", "x-trtllm-subagent-affinity-id", "x-trtllm-subagent-affinity-auth"}

// validate checks the flow_control keys (admission's limit bounds the
// queues when they are used: a queued request is in flight for the
// admission layer).
func (f FlowConfig) validate(admissionMax int, bad complain) {
	if name := strings.ToLower(f.TenantHeader); !validHeaderName(name) {
		bad("flow_control.tenant_header", "%q is not an HTTP header name", f.TenantHeader)
	} else {
		for _, r := range reservedHeaders {
			if name == r {
				bad("flow_control.tenant_header", "%q is read by the edge for another purpose; name another header", f.TenantHeader)
			}
		}
	}
	if f.QueuePerRank < 1 || f.QueuePerRank > MaxQueuePerRank {
		bad("flow_control.queue_per_rank", "must be in 1..%d, got %d", MaxQueuePerRank, f.QueuePerRank)
	}
	if f.Fairness != FairnessTokens && f.Fairness != FairnessRequests {
		bad("flow_control.fairness", "%q is not one of %q, %q", f.Fairness, FairnessTokens, FairnessRequests)
	}
	for _, b := range []struct {
		key string
		c   BandConfig
	}{{"flow_control.interactive", f.Interactive}, {"flow_control.batch", f.Batch}} {
		if b.c.MaxWait <= 0 || b.c.MaxWait > MaxFlowWait {
			bad(b.key+".max_wait", "must be in (0, %s], got %s", MaxFlowWait, b.c.MaxWait)
		}
		if b.c.MaxQueued < 1 {
			bad(b.key+".max_queued", "must be > 0, got %d", b.c.MaxQueued)
		}
	}
	if f.Enabled && f.Interactive.MaxQueued >= 1 && f.Batch.MaxQueued >= 1 && f.Interactive.MaxQueued+f.Batch.MaxQueued > admissionMax {
		bad("flow_control.interactive.max_queued", "with flow_control.batch.max_queued: %d queued requests exceed admission.max_inflight (%d), which counts them as in flight",
			f.Interactive.MaxQueued+f.Batch.MaxQueued, admissionMax)
	}
}

// validHeaderName: an RFC 9110 token, as net/http accepts header names.
func validHeaderName(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return http.CanonicalHeaderKey(s) != ""
}
