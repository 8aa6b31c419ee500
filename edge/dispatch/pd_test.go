package dispatch

import (
	"encoding/json"
	"testing"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/catalog"
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/edge/disagg"
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/routing"
)

// The edge's bootstrap fields name a prefill instance's configured
// bootstrap port (SGLang's default when it has none) and draw rooms modulo
// the context fleet's data_parallel_size; the encoding itself is
// edge/disagg's.
func TestSGLangBootstrapFields(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.ContextServers = config.ServersConfig{Engine: config.EngineSGLang, DataParallelSize: 4,
		URLs: []config.StaticInstance{{Name: "p0", URL: "http://prefill-0.internal:30000", BootstrapPort: 9001}, {Name: "p1", URL: "http://10.0.0.7:30000"}}}
	cat, err := catalog.New(&cfg, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := New(nil, Config{Edge: &cfg, Catalogue: cat})
	one := e.sglangBootstrap(&route.Hop{Hop: routing.Hop{Instance: "p0", URL: "http://prefill-0.internal:30000"}}, 0, 3)
	var room uint64
	if string(one["bootstrap_host"]) != `"prefill-0.internal"` || string(one["bootstrap_port"]) != "9001" || json.Unmarshal(one["bootstrap_room"], &room) != nil || room%4 != 3 {
		t.Fatalf("%s", api.MustMarshal(one))
	}
	batch := e.sglangBootstrap(&route.Hop{Hop: routing.Hop{Instance: "p1", URL: "http://10.0.0.7:30000"}}, 3, 1)
	var hosts []string
	var ports []int
	var rooms []uint64
	_ = json.Unmarshal(batch["bootstrap_host"], &hosts)
	_ = json.Unmarshal(batch["bootstrap_port"], &ports)
	_ = json.Unmarshal(batch["bootstrap_room"], &rooms)
	if len(hosts) != 3 || hosts[2] != "10.0.0.7" || len(ports) != 3 || ports[0] != disagg.DefaultSGLangBootstrapPort || len(rooms) != 3 || rooms[0] == rooms[1] || rooms[1]%4 != 1 {
		t.Fatalf("%s", api.MustMarshal(batch))
	}
}
