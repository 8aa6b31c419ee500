// Package examples runs every edge configuration example that docs/engines.md
// and deploy/ publish for an engine as written: the example must be complete
// (its own listener and Raft addresses, three peers), and the test changes
// only what a deployment would — addresses (loopback listeners for the edges'
// HTTP and Raft ports, the engines' URLs and KV event endpoints pointing at
// stand-ins of the example's engine, the NATS URLs at an in-process server),
// the data directory, the model's tokenizer directory (the words tokenizer
// stands in) and the secrets, which come from the
// environment as deploy/README.md says. Three edges start from each example;
// they must form one Raft group and each must answer a chat request.
//
// deploy/config (tether workers in proxy mode) is run as its deployment by
// test/chaos, with TLS, NATS authorization and workers; the prefill/decode
// splits of vLLM and SGLang (docs and deploy/*-pd) by test/engines/pdstack,
// whose stand-ins are started as the split's prefill and decode servers.
package examples

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"gopkg.in/yaml.v3"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/engines/oaiserve"
	"github.com/tether-project/tether/test/engines/pdstack"
	"github.com/tether-project/tether/test/engines/sglang"
	"github.com/tether-project/tether/test/engines/trtllm"
	"github.com/tether-project/tether/test/engines/vllm"
	"github.com/tether-project/tether/test/natstest"
	"github.com/tether-project/tether/test/testhttp"
	"github.com/tether-project/tether/test/workertest"
	"github.com/tether-project/tether/worker"
)

var root = filepath.Join("..", "..", "..")

const (
	internalKey  = "examples-internal-key-0123456789abcdef"
	adminToken   = "examples-admin-token-0123456789abcdef"
	clusterKey   = "examples-cluster-key-0123456789abcdef"
	natsPassword = "examples-nats-password-0123456789"
)

type example struct {
	name string
	text string
}

// examples are the docs' YAML blocks and deploy's per-engine edge configs.
func examples(t *testing.T) []example {
	t.Helper()
	var out []example
	doc, err := os.ReadFile(filepath.Join(root, "docs", "engines.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cur *strings.Builder
	line, start := 0, 0
	for _, l := range strings.Split(string(doc), "\n") {
		line++
		switch {
		case cur == nil && strings.TrimSpace(l) == "```yaml":
			cur, start = &strings.Builder{}, line+1
		case cur != nil && strings.TrimSpace(l) == "```":
			out = append(out, example{fmt.Sprintf("docs-engines.md-line-%d", start), cur.String()})
			cur = nil
		case cur != nil:
			cur.WriteString(l + "\n")
		}
	}
	files, err := filepath.Glob(filepath.Join(root, "deploy", "*", "edge.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		out = append(out, example{strings.ReplaceAll(rel, string(filepath.Separator), "-"), string(b)})
	}
	if len(out) < 7 {
		t.Fatalf("%d examples, want the docs' four and deploy's three", len(out))
	}
	return out
}

// pdSplit reports whether the example's two fleets are the prefill and
// decode servers of a vLLM or SGLang split (test/engines/pdstack runs those).
func pdSplit(text string) bool {
	var m map[string]any
	if yaml.Unmarshal([]byte(text), &m) != nil {
		return false
	}
	engine := func(k string) string {
		sc, _ := m[k].(map[string]any)
		e, _ := sc["engine"].(string)
		return e
	}
	e := engine("generation_servers")
	return (e == "vllm" || e == "sglang") && engine("context_servers") == e
}

func TestExamplesFormAClusterAndServe(t *testing.T) {
	t.Setenv(edge.EnvInternalRequestAuthKey, internalKey)
	t.Setenv(edge.EnvAdminToken, adminToken)
	t.Setenv(edge.EnvClusterAuthKey, clusterKey)
	t.Setenv(edge.EnvNATSPassword, natsPassword)
	for _, ex := range examples(t) {
		if pdSplit(ex.text) {
			continue
		}
		t.Run(ex.name, func(t *testing.T) { runExample(t, ex.text) })
	}
}

// runExample checks the example is complete, substitutes its addresses and
// starts three edges from it.
func runExample(t *testing.T, text string) {
	var m map[string]any
	if err := yaml.Unmarshal([]byte(text), &m); err != nil {
		t.Fatal(err)
	}
	peers, err := pdstack.CheckComplete(m)
	if err != nil {
		t.Fatal(err)
	}
	backends := startBackends(t, m)
	s, err := pdstack.StartEdges(context.Background(), m, peers, pdstack.Options{
		EdgeConfig:   func(c map[string]any) { backends.substitute(t, c) },
		ReadyTimeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	edges := s.Edges
	model, _ := m["model"].(string)
	for i, e := range edges {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":3,"messages":[{"role":"user","content":"hello from edge %d"}]}`, model, i+1)
		a := testhttp.PostRetrying(t, nil, "http://"+e.Addr()+"/v1/chat/completions", []byte(body), map[string]string{"x-session-id": fmt.Sprintf("example-conv-%d", i)})
		if a.Status != http.StatusOK {
			t.Fatalf("edge %d: %d %s", i+1, a.Status, a.Body)
		}
	}
}

// backends are the stand-ins of the example's engines, by instance name.
type backends struct {
	urls     map[string]string
	kvEvents map[string][2]string
	nats     string
}

func startBackends(t *testing.T, m map[string]any) *backends {
	t.Helper()
	b := &backends{urls: map[string]string{}, kvEvents: map[string][2]string{}}
	if n, ok := m["nats"].(map[string]any); ok && n["urls"] != nil {
		opts := &natsserver.Options{}
		if u, _ := n["user"].(string); u != "" {
			opts.Users = []*natsserver.User{{Username: u, Password: natsPassword}}
		}
		b.nats = natstest.Start(t, opts).ClientURL()
	}
	for _, sec := range modelSections(m) {
		b.startModel(t, m, sec)
	}
	return b
}

// modelSections are the parts of an edge config that name a model's
// fleets: the top level (the first model, `model`) and each entry of
// `models` (`name`).
func modelSections(m map[string]any) []map[string]any {
	secs := []map[string]any{m}
	models, _ := m["models"].([]any)
	for _, x := range models {
		if mm, ok := x.(map[string]any); ok {
			secs = append(secs, mm)
		}
	}
	return secs
}

// startModel starts the stand-ins of one model section's fleets.
func (b *backends) startModel(t *testing.T, m, sec map[string]any) {
	t.Helper()
	model, _ := sec["model"].(string)
	if model == "" {
		model, _ = sec["name"].(string)
	}
	for _, fleet := range []string{"context_servers", "generation_servers"} {
		sc, _ := sec[fleet].(map[string]any)
		if sc == nil {
			continue
		}
		engine, _ := sc["engine"].(string)
		dp, _ := sc["data_parallel_size"].(int)
		bs, _ := sc["block_size"].(int)
		urls, _ := sc["urls"].([]any)
		if len(urls) == 0 && (engine == "" || engine == "tether") {
			b.startWorker(t, m, fleet)
			continue
		}
		for i, u := range urls {
			name, withEvents := fmt.Sprintf("%s-%d", fleet, i), false
			if um, ok := u.(map[string]any); ok {
				if n, _ := um["name"].(string); n != "" {
					name = n
				}
				withEvents = um["kv_events"] != nil
			}
			switch engine {
			case "vllm", "sglang":
				var ev *oaiserve.KVEventsOptions
				if withEvents {
					ev = &oaiserve.KVEventsOptions{Replay: true}
				}
				var srv *oaiserve.Server
				if engine == "vllm" {
					srv = vllm.Start(vllm.Options{Model: model, DataParallelSize: dp, PromptTokensDetails: true, BlockSize: bs, KVEvents: ev})
				} else {
					srv = sglang.Start(sglang.Options{Model: model, DPSize: dp, CacheReport: true, PageSize: bs, KVEvents: ev})
				}
				t.Cleanup(srv.Close)
				b.urls[name] = srv.URL()
				if withEvents {
					pub, replay := srv.KVEventsEndpoints()
					b.kvEvents[name] = [2]string{pub, replay}
				}
			case "trtllm":
				role := "context"
				if fleet == "generation_servers" {
					role = "generation"
				}
				// The edges' key comes from the environment (it wins over
				// the file's), so the servers are configured with it.
				s, err := trtllm.New(trtllm.Config{Name: name, Model: model, Role: role, Key: internalKey, TokensPerBlock: max(bs, 1), EventBufferMaxSize: 10000})
				if err != nil {
					t.Fatal(err)
				}
				srv := httptestServer(t, s.Handler())
				t.Cleanup(s.Close)
				b.urls[name] = srv
			default:
				t.Fatalf("%s: engine %q with urls: no stand-in", fleet, engine)
			}
		}
	}
}

// startWorker starts one simulated tether worker of the fleet, registering
// over the example's NATS.
func (b *backends) startWorker(t *testing.T, m map[string]any, fleet string) {
	t.Helper()
	if b.nats == "" {
		t.Fatalf("%s: tether workers need the example's nats", fleet)
	}
	cfg := worker.DefaultConfig()
	cfg.InstanceID = strings.TrimSuffix(fleet, "_servers") + "-worker"
	cfg.Model, _ = m["model"].(string)
	cfg.Fleet = telemetry.FleetContext
	if fleet == "generation_servers" {
		cfg.Fleet = telemetry.FleetGeneration
	}
	cfg.InternalRequestAuthKey = internalKey // the edges' (the environment's)
	cfg.Hostname, cfg.Port = "127.0.0.1", 0
	cfg.NATS.URLs = []string{b.nats}
	cfg.TelemetryInterval = 50 * time.Millisecond
	cfg.Engine.TimeScale = 0
	cfg.Logger = slog.New(slog.DiscardHandler)
	workertest.Start(t, worker.New, cfg)
}

// substitute points the example's engine URLs, KV event endpoints, NATS
// and tokenizer at the test's.
func (b *backends) substitute(t *testing.T, c map[string]any) {
	t.Helper()
	for _, sec := range modelSections(c) {
		b.substituteFleets(sec)
	}
	if n, ok := c["nats"].(map[string]any); ok && n["urls"] != nil {
		n["urls"] = []any{b.nats}
	}
}

// substituteFleets points one model section's fleets at the stand-ins.
func (b *backends) substituteFleets(c map[string]any) {
	for _, fleet := range []string{"context_servers", "generation_servers"} {
		sc, _ := c[fleet].(map[string]any)
		if sc == nil {
			continue
		}
		if tok, _ := sc["tokenizer"].(string); strings.HasPrefix(tok, "hf:") {
			// The model's directory is not here; the words tokenizer
			// stands in (hf: tokenizers are tested by edge/tokenize/tokenize_test.go
			// against the committed Qwen3 tokenizer, whose 150k-token
			// vocabulary three edges per example would each load).
			sc["tokenizer"] = "words"
		}
		urls, _ := sc["urls"].([]any)
		for i, u := range urls {
			name := fmt.Sprintf("%s-%d", fleet, i)
			um, ok := u.(map[string]any)
			if !ok {
				urls[i] = b.urls[name]
				continue
			}
			if n, _ := um["name"].(string); n != "" {
				name = n
			}
			um["url"] = b.urls[name]
			if ev, ok := um["kv_events"].(map[string]any); ok {
				ev["endpoint"], ev["replay_endpoint"] = b.kvEvents[name][0], b.kvEvents[name][1]
			}
		}
	}
}

func httptestServer(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}
