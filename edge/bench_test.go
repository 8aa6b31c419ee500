package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/stored"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/hintauth"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/test/engines/vllm"
	"github.com/tether-project/tether/worker"
)

// startPlainWorker is a simulated worker (TimeScale 0) without the
// recording proxy, for benchmarks.
func startPlainWorker(tb testing.TB, id string, fleet telemetry.Fleet, role hintauth.Role) *worker.Server {
	tb.Helper()
	cfg := worker.DefaultConfig()
	cfg.InstanceID, cfg.Model, cfg.InternalRequestAuthKey = id, testModel, testKey
	cfg.ADP.EnableAttentionDP = true
	cfg.ADP.AttentionDP.ConversationAffinity = true
	cfg.Ranks = 2
	cfg.Engine.TimeScale, cfg.Engine.BlockSize, cfg.Engine.CapacityBlocks = 0, testBlockSize, 1<<15
	cfg.Fleet, cfg.ServerRole = fleet, role
	cfg.Logger = testLogger(tb)
	srv, err := worker.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = srv.Close(context.Background()) })
	return srv
}

// BenchmarkEdgeOverhead measures what the edge adds to a request: the same
// disaggregated exchange (context_only then generation_only, JSON, bound
// conversation) sent by the client straight to the two workers, and sent
// through the edge, alternating one for one on the same machine. Reported:
// the medians and p99s of both paths and the median added latency
// (p50-added-us; target <= 300).
func BenchmarkEdgeOverhead(b *testing.B) { benchEdgeOverhead(b, nil) }

// BenchmarkEdgeOverheadFlowControl is BenchmarkEdgeOverhead with flow
// control on and the fleet not saturated: what a request's turn costs when
// it need not wait (its tenant and band, the fleet's headroom from the
// views, the controller's lock).
func BenchmarkEdgeOverheadFlowControl(b *testing.B) {
	benchEdgeOverhead(b, func(c *Config) { c.FlowControl.Enabled = true })
}

func benchEdgeOverhead(b *testing.B, mutate func(c *Config)) {
	ctxW, genW, te := startBenchDisagg(b, mutate)
	post := benchPoster(b)
	body := chatBody(b, longText("bench-system", 150), []string{"what next"}, map[string]any{"max_tokens": 4})
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		b.Fatal(err)
	}
	top["conversation_params"] = json.RawMessage(`{"conversation_id":"bench-conv"}`)

	jsonHeader := http.Header{"Content-Type": {"application/json"}, "X-Session-Id": {"bench-conv"}}
	var disaggSeq uint64
	direct := func() {
		disaggSeq++
		id := strconv.FormatUint(disaggSeq, 10)
		m := make(map[string]json.RawMessage, len(top)+1)
		for k, v := range top {
			m[k] = v
		}
		m["disaggregated_params"] = json.RawMessage(`{"request_type":"context_only","disagg_request_id":` + id + `}`)
		cb, _ := json.Marshal(m)
		ctxOut := post(ctxW.URL()+"/v1/chat/completions", cb, jsonHeader)
		var cr struct {
			Choices []struct {
				DP struct {
					CtxRequestID json.RawMessage `json:"ctx_request_id"`
					State        string          `json:"encoded_opaque_state"`
				} `json:"disaggregated_params"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(ctxOut, &cr); err != nil || len(cr.Choices) != 1 {
			b.Fatalf("%v: %s", err, ctxOut)
		}
		st, _ := json.Marshal(cr.Choices[0].DP.State)
		m["disaggregated_params"] = json.RawMessage(`{"request_type":"generation_only","disagg_request_id":` + id +
			`,"ctx_request_id":` + string(cr.Choices[0].DP.CtxRequestID) + `,"encoded_opaque_state":` + string(st) + `}`)
		gb, _ := json.Marshal(m)
		sig, _ := hintauth.SignDisagg([]byte(testKey), nil, st)
		gh := jsonHeader.Clone()
		gh.Set(hintauth.HeaderDisaggAuth, sig)
		post(genW.URL()+"/v1/chat/completions", gb, gh)
	}
	viaEdge := func() { post(te.url()+"/v1/chat/completions", body, jsonHeader) }

	// Warm up: bind the conversation, fill the caches, open connections.
	for range 20 {
		direct()
		viaEdge()
	}
	var dLat, eLat []time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		direct()
		t1 := time.Now()
		viaEdge()
		t2 := time.Now()
		dLat = append(dLat, t1.Sub(t0))
		eLat = append(eLat, t2.Sub(t1))
	}
	b.StopTimer()
	pct := func(xs []time.Duration, p float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return float64(s[min(len(s)-1, int(p*float64(len(s))))].Microseconds())
	}
	b.ReportMetric(pct(dLat, 0.5), "p50-direct-us")
	b.ReportMetric(pct(eLat, 0.5), "p50-edge-us")
	b.ReportMetric(pct(eLat, 0.5)-pct(dLat, 0.5), "p50-added-us")
	b.ReportMetric(pct(dLat, 0.99), "p99-direct-us")
	b.ReportMetric(pct(eLat, 0.99), "p99-edge-us")
}

// BenchmarkRoutingDecision is the edge's in-process share: parse, identity,
// views, sticky routing and body rewriting, without the network.
func BenchmarkRoutingDecision(b *testing.B) {
	s := startStatic(b, 1, 1, nil)
	body := chatBody(b, longText("route", 150), []string{"go"}, nil)
	if r := s.chat(b, body, map[string]string{"x-session-id": "bench-route"}); r.status != http.StatusOK {
		b.Fatalf("%d %s", r.status, r.body)
	}
	e := s.te.e
	ctx := context.Background()
	h := http.Header{"X-Session-Id": {"bench-route"}}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rq, conv, toks, aerr := parseBody(body, apireq.Chat)
		if aerr != nil {
			b.Fatal(aerr)
		}
		rq.RequestID, rq.Now, rq.Hint, rq.Model = "bench", time.Now(), true, e.catalogue.First()
		if aerr := e.identity(rq, conv, h); aerr != nil {
			b.Fatal(aerr)
		}
		rq.PromptTokens = len(toks)
		rq.SetConversation(rq.ID.ConversationID)
		hp, aerr := e.router.Route(ctx, rq, 1, nil)
		if aerr != nil || hp.Outcome != routing.OutcomeSticky {
			b.Fatalf("%+v %v", hp, aerr)
		}
		_ = rq.HopBody(map[string]json.RawMessage{"stream": json.RawMessage("false")})
	}
}

// BenchmarkChainedFollowUp compares, through one edge and the same two
// workers, alternating one for one: a sticky chat turn of a bound
// conversation (context hop, then generation hop) and a Responses
// follow-up chained by previous_response_id (routed by its self-routing
// id, no decision and no log; served whole on the generation worker that
// holds the response; on a vLLM fleet both are one hop), both JSON with
// the same instructions and 4 output tokens. Reported: p50 and p99 of each and the p50 difference
// (p50-added-us: follow-up minus chat turn; target <= 500), and the
// edge's own share of a follow-up's routing (resolve-ns: MAC check and
// fleet-view read).
func BenchmarkChainedFollowUp(b *testing.B) {
	b.Run("tether-workers", func(b *testing.B) {
		_, _, te := startBenchDisagg(b, nil)
		benchFollowUp(b, te)
	})
	// One hop either way: what the edge itself adds shows alone.
	b.Run("vllm", func(b *testing.B) {
		srv := vllm.Start(vllm.Options{Model: testModel, PromptTokensDetails: true, ResponsesStore: true})
		b.Cleanup(srv.Close)
		ec := startEdges(b, 1, "", func(_ int, c *Config) {
			c.Telemetry.ProbeInterval = 100 * time.Millisecond
			c.ContextServers = ServersConfig{URLs: []StaticInstance{{Name: "vllm-0", URL: srv.URL()}}, Engine: EngineVLLM}
			c.GenerationServers = ServersConfig{}
			c.DebugRouteHeader = false
			c.TouchInterval = time.Second
		})
		ec.waitInstances(1)
		benchFollowUp(b, ec.edge(0))
	})
}

func benchFollowUp(b *testing.B, te *testEdge) {
	postURL := benchPoster(b)
	post := func(path string, payload []byte, h http.Header) []byte { return postURL(te.url()+path, payload, h) }
	system := longText("bench-system", 150)
	h := http.Header{"Content-Type": {"application/json"}, "X-Session-Id": {"bench-conv"}}
	chat := chatBody(b, system, []string{"what next"}, map[string]any{"max_tokens": 4})
	first, _ := json.Marshal(map[string]any{"model": testModel, "instructions": system, "input": "start", "max_output_tokens": 4})
	var r struct{ ID string }
	if err := json.Unmarshal(post("/v1/responses", first, h), &r); err != nil || r.ID == "" {
		b.Fatalf("first response: %v", err)
	}
	follow, _ := json.Marshal(map[string]any{"model": testModel, "instructions": system, "input": "what next",
		"max_output_tokens": 4, "previous_response_id": r.ID, "store": false})
	for range 20 {
		post("/v1/chat/completions", chat, h)
		post("/v1/responses", follow, h)
	}
	var cLat, fLat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		post("/v1/chat/completions", chat, h)
		t1 := time.Now()
		post("/v1/responses", follow, h)
		t2 := time.Now()
		cLat, fLat = append(cLat, t1.Sub(t0)), append(fLat, t2.Sub(t1))
	}
	b.StopTimer()
	pct := func(xs []time.Duration, p float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return float64(s[min(len(s)-1, int(p*float64(len(s))))].Microseconds())
	}
	const n = 20000
	t0 := time.Now()
	for range n {
		if _, aerr := te.e.stored.Resolve(r.ID, stored.Previous, t0); aerr != nil {
			b.Fatal(aerr)
		}
	}
	b.ReportMetric(float64(time.Since(t0).Nanoseconds())/n, "resolve-ns")
	b.ReportMetric(pct(cLat, 0.5), "p50-chat-us")
	b.ReportMetric(pct(fLat, 0.5), "p50-followup-us")
	b.ReportMetric(pct(fLat, 0.5)-pct(cLat, 0.5), "p50-added-us")
	b.ReportMetric(pct(cLat, 0.99), "p99-chat-us")
	b.ReportMetric(pct(fLat, 0.99), "p99-followup-us")
}

// benchPoster returns a POST that fails the benchmark on any answer but
// 200, over one pooled client closed at cleanup.
func benchPoster(b *testing.B) func(url string, payload []byte, h http.Header) []byte {
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	b.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	return func(url string, payload []byte, h http.Header) []byte {
		req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(payload))
		if err != nil {
			b.Fatal(err)
		}
		req.Header = h
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			b.Fatalf("%s: %d %v %s", url, resp.StatusCode, err, out)
		}
		return out
	}
}

// startBenchDisagg is one edge in front of a plain context and a plain
// generation worker.
func startBenchDisagg(b *testing.B, mutate func(c *Config)) (ctxW, genW *worker.Server, te *testEdge) {
	ctxW = startPlainWorker(b, "ctx-0", telemetry.FleetContext, hintauth.RoleContext)
	genW = startPlainWorker(b, "gen-0", telemetry.FleetGeneration, hintauth.RoleGeneration)
	ec := startEdges(b, 1, "", func(_ int, c *Config) {
		c.Telemetry.ProbeInterval = 100 * time.Millisecond
		c.ContextServers.URLs = []StaticInstance{{Name: "ctx-0", URL: ctxW.URL()}}
		c.GenerationServers.URLs = []StaticInstance{{Name: "gen-0", URL: genW.URL()}}
		c.DebugRouteHeader = false
		c.TouchInterval = time.Second
		if mutate != nil {
			mutate(c)
		}
	})
	ec.waitInstances(2)
	return ctxW, genW, ec.edge(0)
}
