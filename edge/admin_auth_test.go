package edge

import (
	"net/http"
	"testing"

	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/edge/config"
)

// The Bearer scheme is case-insensitive; operator mistakes on
// the Raft admin endpoints are 404s naming the id, not 500 or 200; and
// metrics_access: admin_token puts /metrics behind the admin token.
func TestAdminOperatorErrorsAndMetricsAccess(t *testing.T) {
	s := startStatic(t, 1, 1, func(c *Config) { c.MetricsAccess = config.MetricsAdminToken })
	for _, scheme := range []string{"Bearer", "bearer", "BEARER"} {
		r := do(t, s.c, http.MethodGet, s.te.url()+"/admin/v1/cluster", nil, map[string]string{"Authorization": scheme + " " + testAdmin})
		if r.status != http.StatusOK {
			t.Errorf("scheme %q: %d %s", scheme, r.status, r.body)
		}
	}
	auth := map[string]string{"Authorization": "Bearer " + testAdmin}
	for _, op := range []string{"remove-peer", "transfer-leader"} {
		r := do(t, s.c, http.MethodPost, s.te.url()+"/admin/v1/raft/"+op, []byte(`{"id":"no-such-edge"}`), auth)
		if r.status != http.StatusNotFound || r.json(t)["error"].(map[string]any)["code"] != "unknown_peer" {
			t.Errorf("%s of an unknown id: %d %s, want 404 unknown_peer", op, r.status, r.body)
		}
	}
	if r := do(t, s.c, http.MethodGet, s.te.url()+"/metrics", nil, nil); r.status != http.StatusUnauthorized {
		t.Errorf("/metrics without the token: %d, want 401", r.status)
	}
	if r := do(t, s.c, http.MethodGet, s.te.url()+"/metrics", nil, map[string]string{"Authorization": "bearer " + testAdmin}); r.status != http.StatusOK {
		t.Errorf("/metrics with the token: %d", r.status)
	}
}

// The admin API names the token's environment variable in its "disabled"
// answer; it must be the one the config reads.
func TestAdminTokenEnvName(t *testing.T) {
	if admin.EnvToken != EnvAdminToken {
		t.Fatalf("admin.EnvToken %q, config reads %q", admin.EnvToken, EnvAdminToken)
	}
}
