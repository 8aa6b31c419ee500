package edge

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/test/engines/oaiserve"
	"github.com/tether-project/tether/test/engines/sglang"
	"github.com/tether-project/tether/test/engines/vllm"
)

// pdSetup is edges in front of a prefill/decode split of vLLM or SGLang
// stand-ins configured by URL (no tether worker, no NATS).
type pdSetup struct {
	kind    EngineKind
	ec      *edgeCluster
	prefill map[string]*oaiserve.Server // by instance name
	decode  map[string]*oaiserve.Server
	c       *http.Client
}

type pdOptions struct {
	dp int
	// events: the prefill servers publish their KV events (block size
	// testBlockSize), which every edge reads.
	events  bool
	scope   routing.Scope
	prefill func(name string) oaiserve.PDOptions
	decode  func(name string) oaiserve.PDOptions
	gate    func(name string) func(int) // decode stream gates
	// responsesStore: vLLM's VLLM_ENABLE_RESPONSES_API_STORE=1.
	responsesStore bool
}

func startPD(t *testing.T, kind EngineKind, o pdOptions) *pdSetup {
	t.Helper()
	s := &pdSetup{kind: kind, prefill: map[string]*oaiserve.Server{}, decode: map[string]*oaiserve.Server{}, c: httpClient(t)}
	start := func(name string, pd oaiserve.PDOptions, gate func(int)) *oaiserve.Server {
		var srv *oaiserve.Server
		var ev *oaiserve.KVEventsOptions
		bs := 0
		if o.events && pd.Role == oaiserve.PDPrefill {
			ev, bs = &oaiserve.KVEventsOptions{Replay: true}, testBlockSize
		}
		if kind == EngineVLLM {
			srv = vllm.Start(vllm.Options{Model: testModel, DataParallelSize: o.dp, PromptTokensDetails: true, BlockSize: bs, KVEvents: ev, PD: &pd, StreamGate: gate,
				ResponsesStore: o.responsesStore})
		} else {
			srv = sglang.Start(sglang.Options{Model: testModel, DPSize: o.dp, CacheReport: true, FastHealth: true, PageSize: bs, KVEvents: ev, PD: &pd, StreamGate: gate})
		}
		t.Cleanup(srv.Close)
		return srv
	}
	var pURLs, dURLs []StaticInstance
	for i := range 2 {
		name := fmt.Sprintf("%s-prefill-%d", kind, i)
		po := oaiserve.PDOptions{}
		if o.prefill != nil {
			po = o.prefill(name)
		}
		po.Role = oaiserve.PDPrefill
		srv := start(name, po, nil)
		s.prefill[name] = srv
		si := StaticInstance{Name: name, URL: srv.URL(), BootstrapPort: srv.BootstrapPort()}
		if o.events {
			pub, replay := srv.KVEventsEndpoints()
			si.KVEvents = &InstanceKVEvents{Endpoint: pub, ReplayEndpoint: replay}
		}
		pURLs = append(pURLs, si)
	}
	for i := range 2 {
		name := fmt.Sprintf("%s-decode-%d", kind, i)
		do := oaiserve.PDOptions{}
		if o.decode != nil {
			do = o.decode(name)
		}
		do.Role = oaiserve.PDDecode
		var gate func(int)
		if o.gate != nil {
			gate = o.gate(name)
		}
		srv := start(name, do, gate)
		s.decode[name] = srv
		dURLs = append(dURLs, StaticInstance{Name: name, URL: srv.URL()})
	}
	s.ec = startEdges(t, 3, "", func(_ int, c *Config) {
		c.Telemetry.ProbeInterval = 100 * time.Millisecond
		c.ContextServers = ServersConfig{URLs: pURLs, Engine: kind, DataParallelSize: o.dp}
		c.GenerationServers = ServersConfig{URLs: dURLs, Engine: kind, DataParallelSize: o.dp}
		c.Scope = o.scope
	})
	s.ec.waitInstances(4)
	waitFor(t, "cluster feature level 2 on every edge", 60*time.Second, func() bool {
		for i := range 3 {
			if s.ec.edge(i).e.node.State().FeatureLevel() < fsm.FeatureLevelRanks {
				return false
			}
		}
		return true
	})
	waitFor(t, "/readyz on every edge", 15*time.Second, func() bool {
		for i := range 3 {
			if r := do(t, s.c, http.MethodGet, s.ec.edge(i).url()+"/readyz", nil, nil); r.status != http.StatusOK {
				return false
			}
		}
		return true
	})
	return s
}

// served finds the server of set that served msg with the given handoff.
func served(t *testing.T, set map[string]*oaiserve.Server, msg, handoff string) (string, oaiserve.Served) {
	t.Helper()
	for name, srv := range set {
		for _, sv := range srv.Served() {
			if sv.LastUser == msg && sv.Handoff == handoff {
				return name, sv
			}
		}
	}
	t.Fatalf("no stand-in served %q as %q", msg, handoff)
	return "", oaiserve.Served{}
}

type pdTurn struct {
	edge              int
	conv, parent, msg string
	stream            bool
}

func (s *pdSetup) send(t *testing.T, m pdTurn, extra map[string]any) response {
	t.Helper()
	h := map[string]string{"x-session-id": m.conv}
	if m.parent != "" {
		h[parentHeader] = m.parent
	}
	if extra == nil {
		extra = map[string]any{}
	}
	if m.stream {
		extra["stream"] = true
		extra["stream_options"] = map[string]any{"include_usage": true}
	}
	sys := m.conv
	if m.parent != "" {
		sys = m.parent
	}
	body := chatBody(t, longText("sys-"+sys, 60), []string{m.msg}, extra)
	r := postChat(t, s.c, s.ec.edge(m.edge).url(), body, h)
	if r.status != http.StatusOK {
		t.Fatalf("edge-%d %s: %d %s", m.edge+1, m.msg, r.status, r.body)
	}
	// The turns go through different edges one after another, as an
	// agent's do once each answer is in: the placements are committed by
	// then (these edges run without NATS, so none hears another's
	// placement before it commits).
	awaitPlacementsApplied(t, s.ec, m.edge)
	return r
}

// streamUsage is the usage of a streamed answer's usage chunk, and whether
// the stream ended with [DONE].
func streamUsage(t *testing.T, body []byte) (map[string]any, bool) {
	t.Helper()
	var usage map[string]any
	done := false
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		if _, bad := ev["error"]; bad {
			t.Fatalf("error event relayed: %s", data)
		}
		if u, ok := ev["usage"].(map[string]any); ok {
			usage = u
		}
	}
	return usage, done
}

func usageCached(u map[string]any) (int, bool) {
	d, ok := u["prompt_tokens_details"].(map[string]any)
	if !ok {
		return 0, false
	}
	c, ok := d["cached_tokens"].(float64)
	return int(c), ok
}

// Three edges in front of two prefill and two decode servers with data
// parallelism: every request is prefilled on one server and decoded on
// another from its KV (the decode computes nothing, or only the last token
// with vLLM), streamed or not; a conversation and its sub-agents share one
// prefill instance and rank from any edge; decode placement follows the
// scope; both fleets' bindings and ranks are in every edge's log; the
// answer's cached tokens are the prefill's.
func TestPDThreeEdgesWithSubagents(t *testing.T) {
	for _, kind := range []EngineKind{EngineVLLM, EngineSGLang} {
		for _, scope := range []routing.Scope{routing.ScopeContext, routing.ScopeBoth} {
			t.Run(fmt.Sprintf("%s/%s", kind, scope), func(t *testing.T) {
				s := startPD(t, kind, pdOptions{dp: 2, scope: scope})
				ranksUsed := map[string]bool{}
				for c := range 3 {
					parent := fmt.Sprintf("%s-%s-parent-%d", kind, scope, c)
					turns := []pdTurn{
						{c % 3, parent, "", parent + " turn 1", false},
						{(c + 1) % 3, parent, "", parent + " turn 2", true},
						{(c + 2) % 3, parent + "-child-a", parent, parent + " child a", c%2 == 0},
						{c % 3, parent + "-child-b", parent, parent + " child b", c%2 == 1},
						{(c + 1) % 3, parent + "-child-a", parent, parent + " child a turn 2", true},
						{(c + 2) % 3, parent, "", parent + " turn 3", false},
					}
					var pInst string
					pRank := -1
					dWhere := map[string]string{} // decode placement by decode key
					for i, m := range turns {
						extra := map[string]any{}
						if i == 1 {
							// Fields a client must not set: the edge owns the handoff.
							extra["kv_transfer_params"] = map[string]any{"do_remote_prefill": true, "remote_block_ids": []int{1}}
							extra["bootstrap_room"] = 7
							extra["routed_dp_rank"] = 1
						}
						r := s.send(t, m, extra)
						pi, ps := served(t, s.prefill, m.msg, oaiserve.HandoffPrefill)
						di, ds := served(t, s.decode, m.msg, oaiserve.HandoffDecode)
						if ds.KVMismatch || (kind == EngineSGLang && ds.Transferred != ds.PromptTokens) || (kind == EngineVLLM && ds.Computed != 1) || (kind == EngineSGLang && ds.Computed != 0) {
							t.Fatalf("%s: decode %+v", m.msg, ds)
						}
						wantRoute := fmt.Sprintf("context=%s/%d; generation=%s/%d", pi, ps.Rank, di, ds.Rank)
						if got := r.header.Get(HeaderRoute); got != wantRoute && !strings.HasPrefix(got, wantRoute+"; ") {
							t.Fatalf("%s: %s %q, served %q", m.msg, HeaderRoute, got, wantRoute)
						}
						if got := r.header.Get(HeaderADPRank); got != fmt.Sprint(ds.Rank) {
							t.Fatalf("%s: %s %q, decoded on rank %d", m.msg, HeaderADPRank, got, ds.Rank)
						}
						var cached int
						var ok bool
						if m.stream {
							u, done := streamUsage(t, r.body)
							if !done || u == nil {
								t.Fatalf("%s: stream without usage or [DONE]: %s", m.msg, r.body)
							}
							cached, ok = usageCached(u)
						} else {
							cached, ok = usageCached(r.json(t)["usage"].(map[string]any))
						}
						if ps.CachedTokens > 0 && (!ok || cached != ps.CachedTokens) || ps.CachedTokens == 0 && ok && cached != 0 {
							// (The decode server's own figure counts the
							// tokens it received: never the client's.)
							t.Fatalf("%s: cached_tokens %d (%v), the prefill found %d", m.msg, cached, ok, ps.CachedTokens)
						}
						if pRank < 0 {
							pInst, pRank = pi, ps.Rank
						} else if pi != pInst || ps.Rank != pRank {
							t.Fatalf("%s via edge-%d prefilled on %s rank %d; the conversation's prefill is on %s rank %d", m.msg, m.edge+1, pi, ps.Rank, pInst, pRank)
						}
						dKey := m.conv
						if scope == routing.ScopeBoth && m.parent != "" {
							dKey = m.parent
						}
						where := fmt.Sprintf("%s/%d", di, ds.Rank)
						if prev, seen := dWhere[dKey]; seen && prev != where {
							t.Fatalf("%s decoded on %s; its decode key %s is on %s", m.msg, where, dKey, prev)
						}
						dWhere[dKey] = where
						if i >= 3 && ps.CachedTokens == 0 {
							t.Fatalf("%s: the prefill found nothing of the shared prompt cached (%+v)", m.msg, ps)
						}
					}
					ranksUsed[fmt.Sprintf("%s/%d", pInst, pRank)] = true
					var last string
					defer func() {
						if t.Failed() {
							t.Log(last)
						}
					}()
					waitFor(t, "both fleets' bindings and ranks in every edge's log", 10*time.Second, func() bool {
						for i := range 3 {
							st := s.ec.edge(i).e.node.State()
							b, ok := st.Lookup(fsm.FleetContext, parent)
							if !ok || b.Instance != pInst || !b.HasRank || int(b.Rank) != pRank {
								last = fmt.Sprintf("edge-%d context %s: %+v %v, want %s/%d", i+1, parent, b, ok, pInst, pRank)
								return false
							}
							for key, where := range dWhere {
								g, ok := st.Lookup(fsm.FleetGeneration, key)
								if !ok || !g.HasRank || fmt.Sprintf("%s/%d", g.Instance, g.Rank) != where {
									last = fmt.Sprintf("edge-%d generation %s: %+v %v, want %s", i+1, key, g, ok, where)
									return false
								}
							}
						}
						return true
					})
				}
				if len(ranksUsed) < 2 {
					t.Fatalf("3 conversations all prefilled on %v", ranksUsed)
				}
				for name, srv := range s.decode {
					for _, sv := range srv.Served() {
						if sv.Handoff != oaiserve.HandoffDecode {
							t.Fatalf("%s served %+v", name, sv)
						}
					}
				}
			})
		}
	}
}

// waitOverflow waits until every edge's log records key's move from one
// instance to another (an Overflow with reason unhealthy).
func (s *pdSetup) waitOverflow(t *testing.T, f fsm.Fleet, key, from, to string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("the %s overflow of %s from %s to %s on every edge", f, key, from, to), 10*time.Second, func() bool {
		for i := range 3 {
			h := adminGet(t, s.c, s.ec.edge(i), fmt.Sprintf("/admin/v1/bindings/%s/%s/history", f, key))
			var hist struct {
				Events []struct {
					Type  string         `json:"type"`
					Event map[string]any `json:"event"`
				} `json:"events"`
			}
			if json.Unmarshal(h.body, &hist) != nil {
				return false
			}
			found := false
			for _, ev := range hist.Events {
				if ev.Type == "Overflow" && ev.Event["from"] == from && ev.Event["to"] == to && ev.Event["reason"] == "unhealthy" {
					found = true
				}
			}
			if !found {
				return false
			}
		}
		return true
	})
}

// A decode server killed in the middle of a stream cuts the client's
// stream (its tokens were relayed); the conversation's next turn finds the
// server gone and is decoded on the other one from the same handoff, and
// the decode binding moves there for every edge.
func TestPDDecodeKilledMidStream(t *testing.T) {
	for _, kind := range []EngineKind{EngineVLLM, EngineSGLang} {
		t.Run(string(kind), func(t *testing.T) {
			var armed atomic.Bool
			hit := make(chan string, 1)
			release := make(chan struct{})
			s := startPD(t, kind, pdOptions{dp: 1, gate: func(name string) func(int) {
				return func(tok int) {
					if tok == 2 && armed.CompareAndSwap(true, false) {
						hit <- name
						<-release
					}
				}
			}})
			conv := string(kind) + "-killed-decode"
			s.send(t, pdTurn{0, conv, "", conv + " turn 1", false}, nil)
			armed.Store(true)
			var wg sync.WaitGroup
			var status int
			var cut []byte
			var cutErr error
			wg.Add(1)
			go func() {
				defer wg.Done()
				h := map[string]string{"x-session-id": conv}
				body := chatBody(t, longText("sys-"+conv, 60), []string{conv + " turn 2"}, map[string]any{"stream": true, "max_tokens": 8})
				status, cut, cutErr = postRaw(t, s.c, s.ec.edge(1).url()+"/v1/chat/completions", json.RawMessage(body), h)
			}()
			victim := <-hit
			s.decode[victim].Kill()
			close(release)
			wg.Wait()
			// The relayed tokens, then an error chunk and an aborted
			// connection: never a clean end.
			if status != http.StatusOK || bytes.Contains(cut, []byte("[DONE]")) || !bytes.Contains(cut, []byte(`" w1"`)) ||
				!bytes.Contains(cut, []byte(`"error"`)) || !errors.Is(cutErr, io.ErrUnexpectedEOF) {
				t.Fatalf("the killed stream: %d %v %s", status, cutErr, cut)
			}
			r := s.send(t, pdTurn{2, conv, "", conv + " turn 3", true}, nil)
			if _, done := streamUsage(t, r.body); !done {
				t.Fatalf("turn 3: %s", r.body)
			}
			di, _ := served(t, s.decode, conv+" turn 3", oaiserve.HandoffDecode)
			if di == victim {
				t.Fatalf("turn 3 decoded on the killed %s", di)
			}
			s.waitOverflow(t, fsm.FleetGeneration, conv, victim, di)
		})
	}
}

// A prefill server killed after it computed the prompt, before the decode
// read its KV: the decode fails the handoff as the engine does, and the
// edge prefills again on the other server and hands that to the decode;
// the client gets its answer and every edge's log records the move.
func TestPDPrefillKilledBetweenHops(t *testing.T) {
	for _, kind := range []EngineKind{EngineVLLM, EngineSGLang} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", kind, stream), func(t *testing.T) {
				var s *pdSetup
				var armed atomic.Bool
				conv := string(kind) + "-killed-prefill"
				var victim string
				s = startPD(t, kind, pdOptions{dp: 1, decode: func(string) oaiserve.PDOptions {
					return oaiserve.PDOptions{BeforeHandoff: func() {
						if armed.CompareAndSwap(true, false) {
							b, _ := s.ec.edge(0).e.node.State().Lookup(fsm.FleetContext, conv)
							victim = b.Instance
							s.prefill[victim].Kill()
						}
					}}
				}})
				s.send(t, pdTurn{0, conv, "", conv + " turn 1", false}, nil)
				waitFor(t, "the prefill binding on edge-1", 30*time.Second, func() bool {
					_, ok := s.ec.edge(0).e.node.State().Lookup(fsm.FleetContext, conv)
					return ok
				})
				armed.Store(true)
				msg := conv + " turn 2"
				r := s.send(t, pdTurn{1, conv, "", msg, stream}, nil)
				if stream {
					if _, done := streamUsage(t, r.body); !done {
						t.Fatalf("%s: %s", msg, r.body)
					}
				}
				if victim == "" {
					t.Fatal("the decode server never got the handoff")
				}
				// The decode server refused the first handoff as the
				// engine does, then decoded the second prefill's.
				served(t, s.decode, msg, oaiserve.HandoffDecodeFailed)
				served(t, s.decode, msg, oaiserve.HandoffDecode)
				// The killed server holds the first prefill of msg; the
				// second must be on another.
				others := maps.Clone(s.prefill)
				delete(others, victim)
				pi, _ := served(t, others, msg, oaiserve.HandoffPrefill)
				s.waitOverflow(t, fsm.FleetContext, conv, victim, pi)
			})
		}
	}
}

// A vLLM prefill the model stops on its first token (EOS) hands its blocks
// off as any other (request_finished keeps them for FINISHED_STOPPED too,
// nixl/pull_scheduler.py), and vLLM's proxy always asks the decode: the
// edge sends the decode server the handoff, which frees the prefill
// server's blocks, and the client's min_tokens, which the decode honours.
// A one-token request is the prefill server's alone.
func TestVLLMPrefillStoppingStillReachesTheDecode(t *testing.T) {
	eos := func(string) oaiserve.PDOptions { return oaiserve.PDOptions{FirstTokenEOS: true} }
	s := startPD(t, EngineVLLM, pdOptions{dp: 1, prefill: eos, decode: eos})
	for _, stream := range []bool{false, true} {
		msg := fmt.Sprintf("eos stream=%v", stream)
		r := s.send(t, pdTurn{0, "eos", "", msg, stream}, nil)
		if r.status != http.StatusOK || !bytes.Contains(r.body, []byte(`"finish_reason":"stop"`)) || bytes.Contains(r.body, []byte("kv_transfer_params")) {
			t.Fatalf("%s: %d %s", msg, r.status, r.body)
		}
		served(t, s.decode, msg, oaiserve.HandoffDecode)
		// min_tokens: the decode server gets it and generates past the
		// stop token.
		msg = fmt.Sprintf("eos min_tokens stream=%v", stream)
		r = s.send(t, pdTurn{0, "eos-min", "", msg, stream}, map[string]any{"min_tokens": 4, "max_tokens": 6})
		if r.status != http.StatusOK || !bytes.Contains(r.body, []byte(`"finish_reason":"length"`)) {
			t.Fatalf("%s: %d %s", msg, r.status, r.body)
		}
		if _, sv := served(t, s.decode, msg, oaiserve.HandoffDecode); !slices.Contains(sv.Fields, "min_tokens") {
			t.Fatalf("%s: the decode request lacks min_tokens: %v", msg, sv.Fields)
		}
		if _, sv := served(t, s.prefill, msg, oaiserve.HandoffPrefill); slices.Contains(sv.Fields, "min_tokens") {
			t.Fatalf("%s: the prefill request carries min_tokens: %v", msg, sv.Fields)
		}
	}
	for name, srv := range s.prefill {
		if n := srv.HeldTransfers(); n != 0 {
			t.Fatalf("prefill server %s still holds %d handoffs: the decode never read them", name, n)
		}
	}
	r := s.send(t, pdTurn{0, "one", "", "one token", false}, map[string]any{"max_tokens": 1})
	if r.header.Get(HeaderRoute) == "" || strings.Contains(r.header.Get(HeaderRoute), "generation=vllm") {
		t.Fatalf("route %q", r.header.Get(HeaderRoute))
	}
	_, sv := served(t, s.prefill, "one token", "")
	if sv.Computed != sv.PromptTokens {
		t.Fatalf("%+v", sv)
	}
	for _, srv := range s.decode {
		for _, sv := range srv.Served() {
			if sv.LastUser == "one token" {
				t.Fatalf("a decode server served the one-token request")
			}
		}
	}
}

// Releases whose request_finished handed off length-capped requests only
// (LegacyNIXL) answer a stopped prefill with kv_transfer_params null: that
// answer is the client's (JSON or stream chunks) and no decode server is
// asked, unless the client asked for min_tokens above 1, whose request the
// decode server computes whole.
func TestVLLMLegacyPrefillStoppingIsTheAnswer(t *testing.T) {
	legacy := func(string) oaiserve.PDOptions { return oaiserve.PDOptions{FirstTokenEOS: true, LegacyNIXL: true} }
	s := startPD(t, EngineVLLM, pdOptions{dp: 1, prefill: legacy, decode: legacy})
	for _, stream := range []bool{false, true} {
		msg := fmt.Sprintf("eos stream=%v", stream)
		r := s.send(t, pdTurn{0, "eos", "", msg, stream}, nil)
		if stream {
			if _, done := streamUsage(t, r.body); !done || !bytes.Contains(r.body, []byte(`"finish_reason":"stop"`)) {
				t.Fatalf("%s", r.body)
			}
		} else if m := r.json(t); m["choices"].([]any)[0].(map[string]any)["finish_reason"] != "stop" {
			t.Fatalf("%s", r.body)
		}
		if _, ok := m(r)["kv_transfer_params"]; ok && !stream {
			t.Fatalf("the handoff was relayed: %s", r.body)
		}
		msg = fmt.Sprintf("eos min_tokens stream=%v", stream)
		r = s.send(t, pdTurn{0, "eos-min", "", msg, stream}, map[string]any{"min_tokens": 3, "max_tokens": 5})
		if r.status != http.StatusOK || !bytes.Contains(r.body, []byte(`"finish_reason":"length"`)) {
			t.Fatalf("%s: %d %s", msg, r.status, r.body)
		}
		if _, sv := served(t, s.decode, msg, ""); !slices.Contains(sv.Fields, "min_tokens") || slices.Contains(sv.Fields, "kv_transfer_params") || sv.Transferred != 0 {
			t.Fatalf("%s: the decode server must compute the request whole: %+v", msg, sv)
		}
	}
	for _, srv := range s.decode {
		for _, sv := range srv.Served() {
			if strings.HasPrefix(sv.LastUser, "eos stream") {
				t.Fatalf("a decode server served %q", sv.LastUser)
			}
		}
	}
}

func m(r response) map[string]any {
	var v map[string]any
	_ = json.Unmarshal(r.body, &v)
	return v
}

func TestPDConfigValidation(t *testing.T) {
	base := func() Config {
		c := DefaultConfig()
		c.Model = "m"
		c.Cluster = ClusterConfig{Settings: cluster.Settings{NodeID: "e1", DataDir: t.TempDir(), Bootstrap: true, Peers: []cluster.Peer{{ID: "e1", Addr: "127.0.0.1:7000"}}}, AuthKey: "cluster-key-0123456789abcdef"}
		c.ContextServers = ServersConfig{Engine: EngineSGLang, URLs: []StaticInstance{{Name: "p", URL: "http://p:30000", BootstrapPort: 9000}}}
		c.GenerationServers = ServersConfig{Engine: EngineSGLang, URLs: []StaticInstance{{Name: "d", URL: "http://d:30000"}}}
		return c
	}
	if c := base(); c.Validate() != nil {
		t.Fatalf("an SGLang split: %v", c.Validate())
	}
	for _, tc := range []struct {
		name   string
		mutate func(c *Config)
		want   string
	}{
		{"decode fleet alone", func(c *Config) { c.ContextServers.Engine = EngineTether }, "generation_servers.engine"},
		{"no decode servers", func(c *Config) { c.GenerationServers.URLs = nil }, "generation_servers.urls"},
		{"bootstrap port on vLLM", func(c *Config) { c.ContextServers.Engine, c.GenerationServers.Engine = EngineVLLM, EngineVLLM }, "urls[0].bootstrap_port: only for"},
		{"bootstrap port on a decode server", func(c *Config) { c.GenerationServers.URLs[0].BootstrapPort = 1 }, "generation_servers.urls[0].bootstrap_port"},
		{"bad bootstrap port", func(c *Config) { c.ContextServers.URLs[0].BootstrapPort = 70000 }, "1..65535"},
		{"conditional disaggregation", func(c *Config) {
			c.ConditionalDisagg.MaxLocalPrefillLength = 10
			c.GenerationServers.Router.Type = routing.RouterKVCacheAware
		}, "conditional_disagg_config"},
	} {
		c := base()
		tc.mutate(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}

// Completions (streamed and not) and requests without a conversation id
// take the split too: an unkeyed request carries no rank, the prefill
// server places it (SGLang: by its room) and the decode finds it.
func TestPDCompletionsAndUnkeyed(t *testing.T) {
	for _, kind := range []EngineKind{EngineVLLM, EngineSGLang} {
		t.Run(string(kind), func(t *testing.T) {
			s := startPD(t, kind, pdOptions{dp: 2})
			for i, tc := range []struct {
				conv   string
				stream bool
			}{{"compl-conv", false}, {"compl-conv", true}, {"", false}, {"", true}} {
				prompt := fmt.Sprintf("%s %s completion %d", longText("shared-prefix", 40), kind, i)
				body := map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 5}
				if tc.stream {
					body["stream"], body["stream_options"] = true, map[string]any{"include_usage": true}
				}
				b, _ := json.Marshal(body)
				h := map[string]string{}
				if tc.conv != "" {
					h["x-session-id"] = tc.conv
				}
				r := do(t, s.c, http.MethodPost, s.ec.edge(i%3).url()+"/v1/completions", b, h)
				if r.status != http.StatusOK {
					t.Fatalf("%s: %d %s", prompt, r.status, r.body)
				}
				if tc.stream {
					if _, done := streamUsage(t, r.body); !done {
						t.Fatalf("%s: %s", prompt, r.body)
					}
				} else if txt := r.json(t)["choices"].([]any)[0].(map[string]any)["text"]; txt != "w0 w1 w2 w3 w4" {
					t.Fatalf("%s: %s", prompt, r.body)
				}
				_, ps := served(t, s.prefill, prompt, oaiserve.HandoffPrefill)
				_, ds := served(t, s.decode, prompt, oaiserve.HandoffDecode)
				if ds.KVMismatch || ps.Path != "/v1/completions" || ds.Path != "/v1/completions" {
					t.Fatalf("prefill %+v decode %+v", ps, ds)
				}
				if tc.conv == "" && (ps.Header != "" || ds.Header != "" || slices.Contains(ps.Fields, "routed_dp_rank") || slices.Contains(ds.Fields, "disagg_prefill_dp_rank")) {
					t.Fatalf("an unkeyed request carried ranks: prefill %+v decode %+v", ps, ds)
				}
			}
		})
	}
}

// Prefill placement is KV-aware from the prefill servers' own KV events:
// once one conversation's system prompt is cached on a prefill server,
// every edge's index holds it there and new conversations sharing it are
// prefilled there, from any edge.
func TestPDPrefillPlacementFollowsTheKVEvents(t *testing.T) {
	for _, kind := range []EngineKind{EngineVLLM, EngineSGLang} {
		t.Run(string(kind), func(t *testing.T) {
			s := startPD(t, kind, pdOptions{dp: 2, events: true})
			system := longText("shared-agent-system", 120)
			first := postChat(t, s.c, s.ec.edge(0).url(), chatBody(t, system, []string{"plan"}, nil), map[string]string{"x-session-id": "kv-parent"})
			if first.status != http.StatusOK {
				t.Fatalf("%d %s", first.status, first.body)
			}
			home, _ := served(t, s.prefill, "plan", oaiserve.HandoffPrefill)
			want := int64(120 / testBlockSize)
			waitFor(t, "every edge's index to hold "+home+"'s blocks from its KV events", 15*time.Second, func() bool {
				for _, srv := range s.prefill {
					srv.PublishHeartbeat() // ZeroMQ's slow joiner: a late batch makes the subscriber replay
				}
				for i := range 3 {
					var out struct {
						Instances []admin.InstanceInfo `json:"instances"`
					}
					if json.Unmarshal(adminGet(t, s.c, s.ec.edge(i), "/admin/v1/instances").body, &out) != nil {
						return false
					}
					ok := false
					for _, in := range out.Instances {
						if in.ID == home && in.KV.Source == admin.KVSourceEngineEvents && in.KV.Blocks >= want {
							ok = true
						}
					}
					if !ok {
						return false
					}
				}
				return true
			})
			for c := range 4 {
				conv := fmt.Sprintf("kv-child-%d", c)
				msg := "sub-task " + conv
				r := postChat(t, s.c, s.ec.edge(1+c%2).url(), chatBody(t, system, []string{msg}, nil), map[string]string{"x-session-id": conv})
				if r.status != http.StatusOK {
					t.Fatalf("%s: %d %s", conv, r.status, r.body)
				}
				if inst, _ := served(t, s.prefill, msg, oaiserve.HandoffPrefill); inst != home {
					t.Fatalf("%s sharing the cached prefix prefilled on %s, the prefix is cached on %s", conv, inst, home)
				}
			}
		})
	}
}
