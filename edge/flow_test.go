package edge

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// Flow control's tenant header is the gateway's to set: with the trust
// boundary on, an untrusted client's is removed (it is the tenant of its
// API key's hash), a trusted one's names the tenant. service_tier flex is
// the batch band. An admitted request says how long it waited; a malformed
// tenant header is a 400 naming it.
func TestFlowTenantFollowsTheGatewayBoundary(t *testing.T) {
	const token = "gateway-token-0123456789"
	s := startStatic(t, 1, 1, func(c *Config) {
		c.TrustedGateway = TrustedGatewayConfig{Enabled: true, TokenHeader: "X-Gateway-Token", Token: token}
		c.FlowControl.Enabled = true
	})
	served := func(band, tenant string) float64 {
		return counter(t, s.te.registry, "tether_edge_flow_served_total", map[string]string{"band": band, "tenant": tenant})
	}
	r := s.chat(t, oneTurn(t, "flow"), map[string]string{"x-tether-tenant": "acme", "Authorization": "Bearer sk-client-key"})
	if r.status != http.StatusOK || r.header.Get(HeaderQueueWait) != "0" {
		t.Fatalf("untrusted: %d %s (queue wait %q)", r.status, r.body, r.header.Get(HeaderQueueWait))
	}
	if served("interactive", "acme") != 0 {
		t.Fatal("an untrusted client named its own tenant")
	}
	tenant, _ := s.te.e.flow.Tenant(http.Header{"Authorization": {"Bearer sk-client-key"}})
	if !strings.HasPrefix(tenant, "key-") || served("interactive", tenant) != 1 {
		t.Fatalf("the untrusted request is not its key's tenant %q", tenant)
	}
	var body map[string]any
	if err := json.Unmarshal(oneTurn(t, "flow"), &body); err != nil {
		t.Fatal(err)
	}
	body["service_tier"] = "flex"
	flex, _ := json.Marshal(body)
	if r := s.chat(t, flex, map[string]string{"x-tether-tenant": "acme", "X-Gateway-Token": token}); r.status != http.StatusOK {
		t.Fatalf("trusted: %d %s", r.status, r.body)
	}
	if served("batch", "acme") != 1 {
		t.Fatal("the gateway's tenant header did not name the tenant, or flex was not the batch band")
	}
	r = s.chat(t, oneTurn(t, "flow"), map[string]string{"x-tether-tenant": "not a tenant", "X-Gateway-Token": token})
	if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), `"param":"x-tether-tenant"`) {
		t.Fatalf("malformed tenant: %d %s", r.status, r.body)
	}
}
