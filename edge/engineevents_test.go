package edge

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/test/engines/oaiserve"
	"github.com/tether-project/tether/test/engines/sglang"
	"github.com/tether-project/tether/test/engines/vllm"
)

// Three edges in front of vLLM (and SGLang) stand-ins configured by URL
// with their ZeroMQ KV event publishers, no tether worker: every edge
// subscribes itself, /admin/v1/instances shows kv.source engine_events with
// the blocks the engine holds on every edge (also those that routed
// nothing there), and new conversations sharing a cached prefix land where
// it is cached, from any edge. Without the events each edge knows only its
// own shadow: the other edges place such conversations blind.
func TestEdgesReadEngineKVEventsDirectly(t *testing.T) {
	for _, kind := range []EngineKind{EngineVLLM, EngineSGLang} {
		t.Run(string(kind), func(t *testing.T) {
			const dp = 2
			servers := map[string]*oaiserve.Server{}
			var urls []StaticInstance
			for i := range 2 {
				name := fmt.Sprintf("%s-%d", kind, i)
				ev := &oaiserve.KVEventsOptions{Replay: true}
				var srv *oaiserve.Server
				if kind == EngineVLLM {
					srv = vllm.Start(vllm.Options{Model: testModel, DataParallelSize: dp, PromptTokensDetails: true, BlockSize: testBlockSize, KVEvents: ev})
				} else {
					srv = sglang.Start(sglang.Options{Model: testModel, DPSize: dp, CacheReport: true, PageSize: testBlockSize, KVEvents: ev, FastHealth: true})
				}
				t.Cleanup(srv.Close)
				servers[name] = srv
				pub, replay := srv.KVEventsEndpoints()
				urls = append(urls, StaticInstance{Name: name, URL: srv.URL(), KVEvents: &InstanceKVEvents{Endpoint: pub, ReplayEndpoint: replay}})
			}
			ec := startEdges(t, 3, "", func(_ int, c *Config) {
				c.Telemetry.ProbeInterval = 100 * time.Millisecond
				c.ContextServers = ServersConfig{URLs: urls, Engine: kind, DataParallelSize: dp}
				c.GenerationServers = ServersConfig{}
			})
			ec.waitInstances(2)
			hc := httpClient(t)
			system := longText("shared-agent-system", 120)
			first := postChat(t, hc, ec.edge(0).url(), chatBody(t, system, []string{"plan"}, nil), map[string]string{"x-session-id": "ev-parent"})
			if first.status != http.StatusOK {
				t.Fatalf("%d %s", first.status, first.body)
			}
			home := ""
			for name, srv := range servers {
				if len(srv.Served()) > 0 {
					home = name
				}
			}
			kvOf := func(i int) admin.InstanceKV {
				var out struct {
					Instances []admin.InstanceInfo `json:"instances"`
				}
				if err := json.Unmarshal(adminGet(t, hc, ec.edge(i), "/admin/v1/instances").body, &out); err != nil {
					t.Fatal(err)
				}
				for _, in := range out.Instances {
					if in.ID == home {
						return in.KV
					}
				}
				return admin.InstanceKV{}
			}
			want := int64(120 / testBlockSize) // the system prompt's blocks: 120 words
			waitFor(t, "every edge's index to hold "+home+"'s blocks from its KV events", 15*time.Second, func() bool {
				for _, s := range servers {
					s.PublishHeartbeat() // ZeroMQ's slow joiner: a late batch makes the subscriber replay
				}
				for i := range 3 {
					if kv := kvOf(i); kv.Source != admin.KVSourceEngineEvents || kv.Approximate || kv.Blocks < want {
						return false
					}
				}
				return true
			})
			if kind == EngineSGLang {
				engineEventsSurviveGarbage(t, servers[home], home, ec, want, kvOf)
			}
			for c := range 4 {
				conv := fmt.Sprintf("ev-child-%d", c)
				r := postChat(t, hc, ec.edge(1+c%2).url(), chatBody(t, system, []string{"sub-task " + conv}, nil), map[string]string{"x-session-id": conv})
				if r.status != http.StatusOK {
					t.Fatalf("%s: %d %s", conv, r.status, r.body)
				}
				if inst, _ := routeOf(t, r); inst != home {
					t.Fatalf("%s sharing the cached prefix placed on %s, the prefix is cached on %s", conv, inst, home)
				}
			}
		})
	}
}

// engineEventsSurviveGarbage puts into every rank's stream of srv a batch
// with an event that does not decode between two that do, and a message
// that is not msgpack: every edge skips and counts them
// (tether_edge_kv_events_undecodable_total) and its index keeps the
// instance's blocks (no reset), while the good events of the batch apply.
func engineEventsSurviveGarbage(t *testing.T, srv *oaiserve.Server, home string, ec *edgeCluster, want int64, kvOf func(int) admin.InstanceKV) {
	t.Helper()
	for r := range 2 {
		bad, err := msgpack.Marshal([]any{1.0, []any{
			[]any{"BlockRemoved", []any{int64(-1)}, "GPU"},
			[]any{"BlockStored", "not a list of hashes", nil, []any{1}, 1, nil, "GPU"},
			[]any{"BlockStored", []any{int64(-2)}, nil, []any{1, 2, 3, 4}, testBlockSize, nil, "GPU", map[string]any{"cache_salt": "s"}},
		}, r})
		if err != nil {
			t.Fatal(err)
		}
		for _, payload := range [][]byte{bad, {0xc1}} {
			if err := srv.PublishRaw(r, payload); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, "every edge to count the undecodable event and message of both ranks", 15*time.Second, func() bool {
		srv.PublishHeartbeat()
		for i := range 3 {
			m := ec.edge(i).e.metrics.KVUndecodable
			if counterValue(m.WithLabelValues(home, "malformed_event")) < 2 || counterValue(m.WithLabelValues(home, "malformed_batch")) < 2 {
				return false
			}
		}
		return true
	})
	for i := range 3 {
		if kv := kvOf(i); kv.Blocks < want {
			t.Fatalf("edge %d holds %d blocks of %s after the undecodable events, want %d (no reset)", i, kv.Blocks, home, want)
		}
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if c.Write(&m) != nil || m.Counter == nil {
		return 0
	}
	return m.Counter.GetValue()
}
