package edge

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/test/engines/oaiserve"
	"github.com/tether-project/tether/test/engines/sglang"
	"github.com/tether-project/tether/test/engines/vllm"
)

// engineSetup is edges in front of vLLM or SGLang stand-ins configured by
// URL, served aggregated (no tether worker, no NATS).
type engineSetup struct {
	ec      *edgeCluster
	servers map[string]*oaiserve.Server // by instance name
	c       *http.Client
}

func startEngines(t *testing.T, kind EngineKind, edges, instances, dp int) *engineSetup {
	t.Helper()
	return startEnginesWith(t, kind, edges, instances, dp, vllm.Options{})
}

// startEnginesWith starts vLLM stand-ins with base's options (SGLang ones
// as startEngines), the edges configured further by mutate.
func startEnginesWith(t *testing.T, kind EngineKind, edges, instances, dp int, base vllm.Options, mutate ...func(*Config)) *engineSetup {
	t.Helper()
	s := &engineSetup{servers: map[string]*oaiserve.Server{}, c: httpClient(t)}
	var urls []StaticInstance
	for i := range instances {
		name := fmt.Sprintf("%s-%d", kind, i)
		var srv *oaiserve.Server
		if kind == EngineVLLM {
			o := base
			o.Model, o.DataParallelSize, o.PromptTokensDetails = testModel, dp, true
			srv = vllm.Start(o)
		} else {
			srv = sglang.Start(sglang.Options{Model: testModel, DPSize: dp, CacheReport: true})
		}
		t.Cleanup(srv.Close)
		s.servers[name] = srv
		urls = append(urls, StaticInstance{Name: name, URL: srv.URL()})
	}
	s.ec = startEdges(t, edges, "", func(_ int, c *Config) {
		c.Telemetry.ProbeInterval = 100 * time.Millisecond
		c.ContextServers = ServersConfig{URLs: urls, Engine: kind, DataParallelSize: dp}
		c.GenerationServers = ServersConfig{}
		for _, m := range mutate {
			m(c)
		}
	})
	s.ec.waitInstances(instances)
	// Ranks are recorded once the cluster runs at feature level 2 (every
	// edge has advertised it): until then the hash alone keeps edges
	// consistent.
	waitFor(t, "cluster feature level 2 on every edge", 60*time.Second, func() bool {
		for i := range edges {
			if s.ec.edge(i).e.node.State().FeatureLevel() < fsm.FeatureLevelRanks {
				return false
			}
		}
		return true
	})
	// Ready: caught up with the log and a healthy context instance (the
	// generation fleet is empty when aggregated).
	waitFor(t, "/readyz on every edge", 15*time.Second, func() bool {
		for i := range edges {
			if r := do(t, s.c, http.MethodGet, s.ec.edge(i).url()+"/readyz", nil, nil); r.status != http.StatusOK {
				return false
			}
		}
		return true
	})
	return s
}

// whereServed finds the instance and rank that answered the request whose
// last user message is msg.
func (s *engineSetup) whereServed(t *testing.T, msg string) (string, int) {
	t.Helper()
	for name, srv := range s.servers {
		for _, sv := range srv.Served() {
			if sv.LastUser == msg {
				return name, sv.Rank
			}
		}
	}
	t.Fatalf("no stand-in served %q", msg)
	return "", 0
}

func (s *engineSetup) chat(t *testing.T, edge int, conv, parent, msg string) response {
	t.Helper()
	h := map[string]string{"x-session-id": conv}
	if parent != "" {
		h[parentHeader] = parent
	}
	body := chatBody(t, longText("sys-"+conv, 40), []string{msg}, nil)
	r := postChat(t, s.c, s.ec.edge(edge).url(), body, h)
	if r.status != http.StatusOK {
		t.Fatalf("edge-%d %s: %d %s", edge+1, msg, r.status, r.body)
	}
	return r
}

// A conversation and its sub-agents land on the same instance and the same
// data-parallel rank from every edge, the rank the log records for the
// binding (RankObserved) and the one the edge relays in x-tether-adp-rank.
func TestEngineConversationAndSubagentsKeepInstanceAndRank(t *testing.T) {
	for _, kind := range []EngineKind{EngineVLLM, EngineSGLang} {
		t.Run(string(kind), func(t *testing.T) {
			const dp = 4
			s := startEngines(t, kind, 3, 2, dp)
			ranksUsed := map[string]bool{}
			for c := range 6 {
				parent := fmt.Sprintf("%s-parent-%d", kind, c)
				msgs := []struct {
					edge              int
					conv, parent, msg string
				}{
					{c % 3, parent, "", parent + " turn 1"},
					{(c + 1) % 3, parent, "", parent + " turn 2"},
					{(c + 2) % 3, parent + "-child-a", parent, parent + " child a"},
					{c % 3, parent + "-child-b", parent, parent + " child b"},
					{(c + 1) % 3, parent + "-child-a", parent, parent + " child a turn 2"},
				}
				var wantInst string
				wantRank := -1
				for _, m := range msgs {
					r := s.chat(t, m.edge, m.conv, m.parent, m.msg)
					inst, rank := s.whereServed(t, m.msg)
					if got := r.header.Get(HeaderADPRank); got != strconv.Itoa(rank) {
						t.Fatalf("%s: %s %q, the engine served rank %d", m.msg, HeaderADPRank, got, rank)
					}
					if route := r.header.Get(HeaderRoute); !strings.HasPrefix(route, fmt.Sprintf("context=%s/%d;", inst, rank)) {
						t.Fatalf("%s: %s %q, want context=%s/%d", m.msg, HeaderRoute, route, inst, rank)
					}
					if wantRank < 0 {
						wantInst, wantRank = inst, rank
						// The first turn was dispatched beside its Bind: later
						// turns follow the committed binding, so they are sent
						// once every edge has it (a turn racing the commit to
						// another edge costs at most its own cache hit).
						waitFor(t, "the conversation's binding on every edge", 10*time.Second, func() bool {
							for i := range 3 {
								if b, ok := s.ec.edge(i).e.node.State().Lookup(fsm.FleetContext, parent); !ok || b.Instance != inst {
									return false
								}
							}
							return true
						})
						continue
					}
					if inst != wantInst || rank != wantRank {
						t.Fatalf("%s via edge-%d served on %s rank %d; the conversation is on %s rank %d", m.msg, m.edge+1, inst, rank, wantInst, wantRank)
					}
				}
				ranksUsed[fmt.Sprintf("%s/%d", wantInst, wantRank)] = true
				// The log records the rank for every edge.
				waitFor(t, "the binding's rank in the log of every edge", 10*time.Second, func() bool {
					for i := range 3 {
						b, ok := s.ec.edge(i).e.node.State().Lookup(fsm.FleetContext, parent)
						if !ok || !b.HasRank || int(b.Rank) != wantRank || b.Instance != wantInst {
							return false
						}
					}
					return true
				})
			}
			if len(ranksUsed) < 2 {
				t.Fatalf("6 conversations all on %v: ranks are not spread", ranksUsed)
			}
		})
	}
}

// A stand-in whose /metrics reports a long queue gets no new
// conversations while the other one is idle: the scraped load feeds
// placement as a worker's load report does.
func TestEngineLongQueueGetsFewerConversations(t *testing.T) {
	for _, kind := range []EngineKind{EngineVLLM, EngineSGLang} {
		t.Run(string(kind), func(t *testing.T) {
			s := startEngines(t, kind, 3, 2, 2)
			busy := string(kind) + "-1"
			s.servers[busy].SetWaiting(1, 40)
			waitFor(t, "every edge to scrape the queue", 10*time.Second, func() bool {
				for i := range 3 {
					in, ok := s.ec.edge(i).e.Fleet().Instance(busy, time.Now())
					if !ok || in.QueuedRequests < 40 {
						return false
					}
				}
				return true
			})
			counts := map[string]int{}
			for c := range 12 {
				msg := fmt.Sprintf("%s-new-%d hello", kind, c)
				s.chat(t, c%3, fmt.Sprintf("%s-new-%d", kind, c), "", msg)
				inst, _ := s.whereServed(t, msg)
				counts[inst]++
			}
			if counts[busy] != 0 {
				t.Fatalf("the instance reporting 40 queued requests got %d of 12 new conversations (%v)", counts[busy], counts)
			}
			// Once its queue drains it takes new conversations again.
			s.servers[busy].SetWaiting(1, 0)
			waitFor(t, "every edge to scrape the drained queue", 10*time.Second, func() bool {
				for i := range 3 {
					in, ok := s.ec.edge(i).e.Fleet().Instance(busy, time.Now())
					if !ok || in.QueuedRequests != 0 {
						return false
					}
				}
				return true
			})
			for c := range 12 {
				msg := fmt.Sprintf("%s-later-%d hello", kind, c)
				s.chat(t, c%3, fmt.Sprintf("%s-later-%d", kind, c), "", msg)
				inst, _ := s.whereServed(t, msg)
				counts[inst]++
			}
			if counts[busy] == 0 {
				t.Fatalf("the drained instance got none of 12 later conversations (%v)", counts)
			}
		})
	}
}

// Streaming and the completions endpoint go through the same pinning; a
// request without a conversation id carries no rank header (the engine's
// own balancer picks), and the engine's cached tokens reach the client.
func TestEngineStreamingCompletionsAndUnkeyed(t *testing.T) {
	s := startEngines(t, EngineVLLM, 1, 1, 2)
	srv := s.servers["vllm-0"]
	u := s.ec.edge(0).url()
	prompt := longText("completion-prompt", 40)
	var ranks []int
	for i := range 2 {
		body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`, testModel, prompt+fmt.Sprint(i))
		r := do(t, s.c, http.MethodPost, u+"/v1/completions", []byte(body), map[string]string{"x-session-id": "completion-conv"})
		if r.status != http.StatusOK || !strings.Contains(string(r.body), "data: [DONE]") || !strings.Contains(string(r.body), `"usage"`) {
			t.Fatalf("stream %d: %d %s", i, r.status, r.body)
		}
		rank, err := strconv.Atoi(r.header.Get(HeaderADPRank))
		if err != nil {
			t.Fatalf("stream %d: %s %q", i, HeaderADPRank, r.header.Get(HeaderADPRank))
		}
		ranks = append(ranks, rank)
		if i == 1 && (!strings.Contains(string(r.body), `"cached_tokens":`) || strings.Contains(string(r.body), `"cached_tokens":0`)) {
			t.Fatalf("second turn reports no cached tokens: %s", r.body)
		}
	}
	if ranks[0] != ranks[1] {
		t.Fatalf("one conversation on ranks %v", ranks)
	}
	served := srv.Served()
	for _, sv := range served {
		if sv.Header != strconv.Itoa(ranks[0]) {
			t.Fatalf("served with rank header %q, want %d", sv.Header, ranks[0])
		}
		// The body goes as the client sent it: nothing tether-specific.
		if want := "max_tokens model prompt stream stream_options"; strings.Join(sv.Fields, " ") != want {
			t.Fatalf("the engine received fields %v, want %s", sv.Fields, want)
		}
	}
	body := fmt.Sprintf(`{"model":%q,"prompt":"no conversation id","max_tokens":2}`, testModel)
	if r := do(t, s.c, http.MethodPost, u+"/v1/completions", []byte(body), nil); r.status != http.StatusOK {
		t.Fatalf("unkeyed: %d %s", r.status, r.body)
	}
	served = srv.Served()
	if last := served[len(served)-1]; last.LastUser != "no conversation id" || last.Header != "" {
		t.Fatalf("unkeyed request served as %+v, want no rank header", last)
	}
}

// With the overflow thresholds configured (relief off), a bound
// conversation whose server reports a queue at the threshold overflows to
// the other server (recorded in the log), as with a worker's load report.
func TestEngineBoundConversationOverflowsOnLongQueue(t *testing.T) {
	s := startEnginesWith(t, EngineSGLang, 3, 2, 2, vllm.Options{}, func(c *Config) {
		c.Placement.Overflow.QueuedRequests, c.Placement.Overflow.ReliefFactor = 8, 0
	})
	s.chat(t, 0, "ovf-conv", "", "ovf turn 1")
	home, _ := s.whereServed(t, "ovf turn 1")
	for r := range 2 {
		s.servers[home].SetWaiting(r, 10) // placement.overflow.queued_requests is 8
	}
	waitFor(t, "every edge to scrape the queue", 10*time.Second, func() bool {
		for i := range 3 {
			if in, ok := s.ec.edge(i).e.Fleet().Instance(home, time.Now()); !ok || in.QueuedRequests < 20 {
				return false
			}
		}
		return true
	})
	r := s.chat(t, 1, "ovf-conv", "", "ovf turn 2")
	if inst, _ := s.whereServed(t, "ovf turn 2"); inst == home {
		t.Fatalf("turn 2 stayed on %s with 20 queued requests (route %s)", home, r.header.Get(HeaderRoute))
	}
	waitFor(t, "the overflow in the binding's history", 10*time.Second, func() bool {
		h := adminGet(t, s.c, s.ec.edge(2), "/admin/v1/bindings/context/ovf-conv/history")
		return strings.Contains(string(h.body), `"Overflow"`)
	})
}

// SGLang's /health answers after a second (it generates one token): with
// the probe interval of the docs' example (500ms) the fleet's default probe
// timeout still lets the instance become healthy, its /metrics scraped, and
// requests served. A probe bounded by the probe interval, as before, timed
// out on every round: 503 no_healthy_instance forever.
func TestSGLangSlowHealthBecomesHealthy(t *testing.T) {
	srv := sglang.Start(sglang.Options{Model: testModel, CacheReport: true})
	t.Cleanup(srv.Close)
	srv.SetWaiting(0, 3)
	start := func(timeout time.Duration) *edgeCluster {
		return startEdges(t, 1, "", func(_ int, c *Config) {
			c.Telemetry.ProbeInterval = 500 * time.Millisecond
			c.ContextServers = ServersConfig{URLs: []StaticInstance{{Name: "sglang-0", URL: srv.URL()}}, Engine: EngineSGLang, HealthTimeout: timeout}
			c.GenerationServers = ServersConfig{}
		})
	}
	ec := start(0)
	waitFor(t, "the SGLang instance healthy with its queue scraped", 15*time.Second, func() bool {
		in, ok := ec.edge(0).e.Fleet().Instance("sglang-0", time.Now())
		return ok && in.Healthy && in.QueuedRequests == 3
	})
	c := httpClient(t)
	body := chatBody(t, "slow health", []string{"hello"}, nil)
	if r := postChat(t, c, ec.edge(0).url(), body, map[string]string{"x-session-id": "slow-health"}); r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	// A timeout below SGLang's one-second answer never sees it healthy.
	short := start(500 * time.Millisecond)
	waitFor(t, "three failed probes", 15*time.Second, func() bool {
		return counter(t, short.edge(0).e.registry, "tether_edge_probes_total", map[string]string{"result": "failed"}) >= 3
	})
	if in, _ := short.edge(0).e.Fleet().Instance("sglang-0", time.Now()); in.Healthy {
		t.Fatal("healthy with a 500ms probe timeout against a one-second /health")
	}
}
