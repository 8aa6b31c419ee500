package edge

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/test/engines/oaiserve"
	"github.com/tether-project/tether/test/engines/sglang"
	"github.com/tether-project/tether/test/engines/vllm"
	"github.com/tether-project/tether/test/natstest"
)

// vLLM and SGLang stand-ins configured by URL publish no KV events: the
// edge's shadow of each one's cache credits a conversation's next turn on
// the instance that served the last one, sized from the engine's /metrics,
// and a response reporting fewer cached tokens than the shadow predicted
// lowers that credit. /admin/v1/instances shows where the knowledge comes
// from.
func TestShadowCacheCreditsTheNextTurnAndLearnsFromCachedTokens(t *testing.T) {
	for _, kind := range []EngineKind{EngineVLLM, EngineSGLang} {
		t.Run(string(kind), func(t *testing.T) { testShadowCache(t, kind) })
	}
}

func testShadowCache(t *testing.T, kind EngineKind) {
	const blockSize = 16 // vLLM's default block size, as the edge must be configured
	servers := map[string]*oaiserve.Server{}
	var urls []StaticInstance
	for _, name := range []string{"eng-a", "eng-b"} {
		var srv *oaiserve.Server
		if kind == EngineVLLM {
			srv = vllm.Start(vllm.Options{Model: testModel, PromptTokensDetails: true})
		} else {
			srv = sglang.Start(sglang.Options{Model: testModel, CacheReport: true})
		}
		t.Cleanup(srv.Close)
		servers[name] = srv
		urls = append(urls, StaticInstance{Name: name, URL: srv.URL()})
	}
	ec := startEdges(t, 1, "", func(_ int, c *Config) {
		c.Telemetry.ProbeInterval = 100 * time.Millisecond
		c.Placement.BlockSize = blockSize
		c.ContextServers = ServersConfig{URLs: urls, Engine: kind, KVShadowBlocks: config.DefaultKVShadowBlocks}
		c.GenerationServers = ServersConfig{}
	})
	ec.waitInstances(2)
	te := ec.edge(0)
	hc := httpClient(t)
	// The shadow is sized from the engine's reported capacity (vLLM's
	// stand-in: vllm:cache_config_info, 4096 blocks of 16 tokens per rank;
	// SGLang's: sglang:max_total_num_tokens) once the first scrape is in.
	waitFor(t, "the engines' KV capacity scraped", 10*time.Second, func() bool {
		for name := range servers {
			in, ok := te.e.fleet.Instance(name, time.Now())
			if !ok || in.RankKVTokens <= 0 || !in.Healthy || (kind == EngineVLLM && in.RankKVTokens != 4096*16) {
				return false
			}
		}
		return true
	})
	waitFor(t, "/readyz", 10*time.Second, func() bool {
		return do(t, hc, http.MethodGet, te.url()+"/readyz", nil, nil).status == http.StatusOK
	})

	system := longText("shadow-sys", 150)
	turns := [][]string{
		{"shadow turn one"},
		{"shadow turn one", "reply one", "shadow turn two"},
		{"shadow turn one", "reply one", "shadow turn two", "reply two", "shadow turn three"},
		{"shadow turn one", "reply one", "shadow turn two", "reply two", "shadow turn three", "reply three", "shadow turn four"},
	}
	bodies := make([][]byte, len(turns))
	blocks := make([][]uint64, len(turns))
	for i, tt := range turns {
		var extra map[string]any
		if i == 2 && kind == EngineSGLang {
			// The correction also comes from a stream's final usage chunk.
			extra = map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true}}
		}
		bodies[i] = chatBody(t, system, tt, extra)
		_, _, toks, aerr := parseBody(bodies[i], apireq.Chat)
		if aerr != nil {
			t.Fatal(aerr.Message)
		}
		blocks[i] = prefix.BlockHashes(toks, blockSize)
	}
	send := func(i int) response {
		t.Helper()
		r := do(t, hc, http.MethodPost, te.url()+"/v1/chat/completions", bodies[i], map[string]string{"x-session-id": "shadow-conv"})
		if r.status != http.StatusOK {
			t.Fatalf("turn %d: %d %s", i+1, r.status, r.body)
		}
		return r
	}
	// credit is what placement reads for turn i's prompt on an instance:
	// stored blocks only (an hour on, the edge's own predictions expired).
	credit := func(i int, instance string) int {
		for _, m := range te.e.fleet.Index().Match(blocks[i], time.Now().Add(time.Hour), nil) {
			if m.Instance == instance {
				return m.Blocks
			}
		}
		return 0
	}
	served := func(msg string) string {
		for name, srv := range servers {
			for _, sv := range srv.Served() {
				if sv.LastUser == msg {
					return name
				}
			}
		}
		t.Fatalf("no stand-in served %q", msg)
		return ""
	}
	instances := func() map[string]admin.InstanceInfo {
		var out struct {
			Instances []admin.InstanceInfo `json:"instances"`
		}
		if err := json.Unmarshal(adminGet(t, hc, te, "/admin/v1/instances").body, &out); err != nil {
			t.Fatal(err)
		}
		m := map[string]admin.InstanceInfo{}
		for _, in := range out.Instances {
			m[in.ID] = in
		}
		return m
	}

	send(0)
	home := served("shadow turn one")
	other := "eng-a"
	if home == other {
		other = "eng-b"
	}
	// Turn 2 shares turn 1's whole prompt: every whole block of it is
	// credited on the instance that served it, nothing elsewhere.
	want := len(blocks[0])
	if want < 5 {
		t.Fatalf("turn 1 is only %d blocks: the test needs a longer prompt", want)
	}
	if got := credit(1, home); got != want {
		t.Fatalf("turn 2's credit on %s (served turn 1): %d blocks, want %d", home, got, want)
	}
	if got := credit(1, other); got != 0 {
		t.Fatalf("turn 2's credit on %s (never served it): %d blocks", other, got)
	}
	inst := instances()
	if kv := inst[home].KV; kv.Source != admin.KVSourceShadow || !kv.Approximate || kv.Blocks != int64(want) ||
		len(kv.Ranks) != 1 || kv.Ranks[0] != (admin.RankKV{Rank: 0, Blocks: int64(want)}) || kv.LastSeq != 1 {
		t.Fatalf("admin kv of %s: %+v, want the shadow's %d blocks on rank 0, seq 1", home, kv, want)
	}
	if kv := inst[other].KV; kv.Source != admin.KVSourcePredictionsOnly || kv.Blocks != 0 || kv.LastSeq != 0 {
		t.Fatalf("admin kv of %s: %+v, want predictions only", other, kv)
	}

	// Turn 2: the engine reports at least the shadow's prediction, so
	// nothing is corrected and turn 3 is credited with all of turn 2.
	r := send(1)
	if served("shadow turn two") != home {
		t.Fatal("turn 2 left its instance")
	}
	if c := cachedTokens(t, r.json(t)); c < want*blockSize {
		t.Fatalf("turn 2 reported %d cached tokens, want >= %d: the stand-in and the edge disagree on blocks", c, want*blockSize)
	}
	if got := credit(2, home); got != len(blocks[1]) {
		t.Fatalf("turn 3's credit: %d blocks, want turn 2's %d", got, len(blocks[1]))
	}

	// The engine loses its cache (a reset, or eviction the edge never
	// saw). Turn 3 reports no cached tokens — both engines then leave
	// prompt_tokens_details null, which from an instance that reported
	// cached tokens before means none: the shadow drops the chain, and
	// turn 4 is credited nothing until the engine proves otherwise.
	seqBefore := instances()[home].KV.LastSeq
	servers[home].FlushCache()
	r = send(2)
	if !strings.Contains(string(r.body), `"prompt_tokens_details":null`) {
		t.Fatalf("turn 3 after the flush: %s, want no prompt_tokens_details (nothing cached)", r.body)
	}
	if kind == EngineSGLang && !strings.Contains(string(r.body), "data: [DONE]") {
		t.Fatalf("turn 3 (streamed) after the flush: %s", r.body)
	}
	waitFor(t, "the correction from cached_tokens", 5*time.Second, func() bool { return credit(3, home) == 0 })
	if kv := instances()[home].KV; kv.Source != admin.KVSourceShadow || kv.Blocks != 0 || kv.LastSeq <= seqBefore {
		t.Fatalf("admin kv after the correction: %+v, want 0 blocks and a batch after seq %d", kv, seqBefore)
	}
	// The binding stays: a shadow's "no" is not eviction evidence, and the
	// engine now holds turn 3 again; the next turn restores the credit.
	send(3)
	if served("shadow turn four") != home {
		t.Fatal("turn 4 left its instance")
	}
	if got := credit(3, home); got != len(blocks[3]) {
		t.Fatalf("turn 4 re-stored: credit %d, want %d", got, len(blocks[3]))
	}
}

// Simulated tether workers over NATS: the index's blocks come from their
// KV events, exact, with the last batch's sequence number.
func TestAdminInstancesShowTetherWorkerKV(t *testing.T) {
	ns := natstest.Start(t, nil)
	startDisaggFleet(t, ns.ClientURL(), workerOpts{})
	ec := startEdges(t, 1, ns.ClientURL(), nil)
	ec.waitInstances(4)
	c := httpClient(t)
	a := &agent{session: "kv-admin-conv", system: longText("kv-admin", 200)}
	first := a.send(t, c, ec.edge(0), "one", nil)
	var got admin.InstanceKV
	waitFor(t, "the KV events of "+first.ctxInst+" in /admin/v1/instances", 10*time.Second, func() bool {
		var out struct {
			Instances []admin.InstanceInfo `json:"instances"`
		}
		if err := json.Unmarshal(adminGet(t, c, ec.edge(0), "/admin/v1/instances").body, &out); err != nil {
			t.Fatal(err)
		}
		for _, in := range out.Instances {
			if in.KV.Source != admin.KVSourceTetherWorker {
				t.Fatalf("%s: kv source %q, want %q", in.ID, in.KV.Source, admin.KVSourceTetherWorker)
			}
			if in.ID == first.ctxInst {
				got = in.KV
			}
		}
		return got.Blocks > 0 && got.LastSeq > 0
	})
	var sum int64
	for _, r := range got.Ranks {
		sum += r.Blocks
	}
	if got.Approximate || sum != got.Blocks {
		t.Fatalf("kv of %s: %+v (ranks must add up; events are exact)", first.ctxInst, got)
	}
}
