package edge

import (
	"strings"
	"testing"

	"github.com/tether-project/tether/routing"
)

// New validates the configuration it is given (edge/config's rules) and
// refuses what Validate refuses, naming the key.
func TestNewRefusesAnInvalidConfiguration(t *testing.T) {
	c := DefaultConfig()
	c.Model = "m"
	c.InternalRequestAuthKey = "0123456789abcdef0123"
	c.ParentHeader = "X-Parent"
	c.ContextServers.URLs = []StaticInstance{{URL: "http://a:1"}}
	c.GenerationServers.URLs = []StaticInstance{{URL: "http://b:1"}}
	c.Cluster.NodeID, c.Cluster.DataDir = "e1", "/tmp/x"
	c.Scope = routing.ScopeBoth
	c.GenerationServers.Router.Type = routing.RouterKVCacheAware
	if _, err := New(c, Deps{}); err == nil || !strings.Contains(err.Error(), "subagent_affinity_scope") {
		t.Fatalf("New: %v, want the config error naming subagent_affinity_scope", err)
	}
}
