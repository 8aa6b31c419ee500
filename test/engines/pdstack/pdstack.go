// Package pdstack starts whole local deployments of the vLLM and SGLang
// stand-ins behind three tether edges, for the tests and the benchmark of
// prefill/decode disaggregation:
//
//   - StartExample: three edges from an edge configuration example as
//     published (deploy/vllm-pd, deploy/sglang-pd, the docs' blocks),
//     changing only what a deployment would: the addresses (loopback
//     listeners for the edges' HTTP and Raft ports, the engines' URLs, KV
//     event endpoints and bootstrap ports pointing at stand-ins of the
//     example's engines, prefill servers for the context fleet and decode
//     servers for the generation fleet when both name the engine), the data
//     directory, the model's tokenizer directory (the words tokenizer stands
//     in) and the secrets, which come from the environment;
//   - Aggregated: the same example with its prefill and decode servers
//     serving whole requests in one fleet (the engines' aggregated setup on
//     the same servers);
//   - StartEmulated: the same servers without a KV connector behind tether
//     workers in proxy mode (deploy/config's shape): the context worker
//     asks its engine for one token, the generation worker's engine
//     computes the whole prompt again.
//
// Every engine's /metrics reports its prompt tokens by source (computed,
// cached, transferred), so a benchmark compares the prefill work of the
// three (cmd/tether bench replay --engine-metrics).
package pdstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/engines/oaiserve"
	"github.com/tether-project/tether/test/engines/sglang"
	"github.com/tether-project/tether/test/engines/vllm"
	"github.com/tether-project/tether/worker"
)

// Options adjust the stand-ins.
type Options struct {
	// Prefill and Decode are applied to the prefill and decode servers
	// (their Role is set by the fleet).
	Prefill, Decode oaiserve.PDOptions
	// GPUBlocks is each stand-in rank's KV capacity in blocks (0: the
	// stand-in's default).
	GPUBlocks int
	// Logger receives the edges' and workers' logs (nil: discarded).
	Logger *slog.Logger
	// ReadyTimeout bounds the start (default 60 s).
	ReadyTimeout time.Duration
	// EdgeConfig, when set, adjusts each edge's configuration (the decoded
	// YAML) after the stack set its addresses, data directory and
	// tokenizer.
	EdgeConfig func(c map[string]any)
}

// Stack is a running deployment.
type Stack struct {
	Edges []*edge.Edge
	// Servers are the stand-ins by instance name; Prefill and Decode name
	// the split's (empty otherwise).
	Servers         map[string]*oaiserve.Server
	Prefill, Decode []string
	Model           string

	workers []*worker.Server
	nats    *natsserver.Server
	dir     string
}

// EdgeURLs are the edges' base URLs.
func (s *Stack) EdgeURLs() []string {
	out := make([]string, len(s.Edges))
	for i, e := range s.Edges {
		out[i] = "http://" + e.Addr()
	}
	return out
}

// MetricsURLs are every engine's /metrics.
func (s *Stack) MetricsURLs() []string {
	var out []string
	for _, srv := range s.Servers {
		out = append(out, srv.URL()+"/metrics")
	}
	return out
}

// Close stops everything.
func (s *Stack) Close() {
	var wg sync.WaitGroup
	for _, e := range s.Edges {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = e.Close(ctx)
		}()
	}
	wg.Wait()
	for _, w := range s.workers {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = w.Close(ctx)
		cancel()
	}
	for _, srv := range s.Servers {
		srv.Close()
	}
	if s.nats != nil {
		s.nats.Shutdown()
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

// ParseExample reads an example's YAML.
func ParseExample(text string) (map[string]any, error) {
	var m map[string]any
	if err := yaml.Unmarshal([]byte(text), &m); err != nil {
		return nil, err
	}
	return m, nil
}

// CheckComplete: the example names its listener, its Raft bind and
// advertised addresses, three peers with its own address among them. It
// returns the peers' ids.
func CheckComplete(m map[string]any) ([]string, error) {
	var errs []error
	if _, ok := m["hostname"]; !ok {
		errs = append(errs, errors.New("no hostname: the edge would listen on loopback only"))
	}
	cl, _ := m["cluster"].(map[string]any)
	if cl == nil {
		return nil, errors.New("no cluster section")
	}
	for _, k := range []string{"bind_addr", "advertise_addr", "node_id", "data_dir"} {
		if s, _ := cl[k].(string); s == "" {
			errs = append(errs, fmt.Errorf("no cluster.%s", k))
		}
	}
	ps, _ := cl["peers"].([]any)
	var ids []string
	own := false
	for _, p := range ps {
		pm, _ := p.(map[string]any)
		id, _ := pm["id"].(string)
		ids = append(ids, id)
		if id == cl["node_id"] && pm["addr"] == cl["advertise_addr"] {
			own = true
		}
	}
	if len(ids) != 3 {
		errs = append(errs, fmt.Errorf("%d peers, want the three edges", len(ids)))
	}
	if !own {
		errs = append(errs, errors.New("cluster.advertise_addr is not this edge's address in cluster.peers"))
	}
	return ids, errors.Join(errs...)
}

// fleet is one of an example's fleets.
type fleet struct {
	key    string
	m      map[string]any
	engine string
	dp, bs int
	urls   []any
}

func fleets(m map[string]any) []fleet {
	var out []fleet
	for _, k := range []string{"context_servers", "generation_servers"} {
		sc, _ := m[k].(map[string]any)
		if sc == nil {
			continue
		}
		f := fleet{key: k, m: sc}
		f.engine, _ = sc["engine"].(string)
		f.dp, _ = sc["data_parallel_size"].(int)
		f.bs, _ = sc["block_size"].(int)
		f.urls, _ = sc["urls"].([]any)
		out = append(out, f)
	}
	return out
}

// entry is a urls item as a map (a plain URL becomes {url}); name is its
// instance name.
func entry(f fleet, i int) (map[string]any, string) {
	um, ok := f.urls[i].(map[string]any)
	if !ok {
		um = map[string]any{"url": f.urls[i]}
		f.urls[i] = um
	}
	name, _ := um["name"].(string)
	if name == "" {
		name = fmt.Sprintf("%s-%d", strings.TrimSuffix(f.key, "_servers"), i)
		um["name"] = name
	}
	return um, name
}

// parseStack reads and checks an example: the stack to start for it, the
// example and its peers' ids.
func parseStack(text string) (*Stack, map[string]any, []string, error) {
	m, err := ParseExample(text)
	if err != nil {
		return nil, nil, nil, err
	}
	peers, err := CheckComplete(m)
	if err != nil {
		return nil, nil, nil, err
	}
	return stackFor(m), m, peers, nil
}

// stackFor is the empty stack of example m.
func stackFor(m map[string]any) *Stack {
	s := &Stack{Servers: map[string]*oaiserve.Server{}}
	s.Model, _ = m["model"].(string)
	return s
}

// StartExample starts the example's engines as stand-ins and three edges
// from it.
func StartExample(ctx context.Context, text string, o Options) (*Stack, error) {
	s, m, peers, err := parseStack(text)
	if err != nil {
		return nil, err
	}
	fs := fleets(m)
	split := len(fs) == 2 && fs[0].engine != "" && fs[0].engine == fs[1].engine && (fs[0].engine == "vllm" || fs[0].engine == "sglang")
	for _, f := range fs {
		if len(f.urls) == 0 {
			continue
		}
		for i := range f.urls {
			um, name := entry(f, i)
			_, withEvents := um["kv_events"]
			var pd *oaiserve.PDOptions
			if split {
				p := o.Prefill
				p.Role = oaiserve.PDPrefill
				if f.key == "generation_servers" {
					p = o.Decode
					p.Role = oaiserve.PDDecode
				}
				pd = &p
			}
			srv, err := s.startServer(f.engine, name, f.dp, f.bs, withEvents, pd, o)
			if err != nil {
				s.Close()
				return nil, err
			}
			um["url"] = srv.URL()
			if ev, ok := um["kv_events"].(map[string]any); ok {
				pub, replay := srv.KVEventsEndpoints()
				ev["endpoint"] = pub
				if _, ok := ev["replay_endpoint"]; ok {
					ev["replay_endpoint"] = replay
				}
			}
			if split && f.engine == "sglang" && f.key == "context_servers" {
				um["bootstrap_port"] = srv.BootstrapPort()
			}
			if split {
				if f.key == "context_servers" {
					s.Prefill = append(s.Prefill, name)
				} else {
					s.Decode = append(s.Decode, name)
				}
			}
		}
	}
	if err := s.startEdges(ctx, m, peers, o); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Stack) startServer(engine, name string, dp, bs int, events bool, pd *oaiserve.PDOptions, o Options) (*oaiserve.Server, error) {
	var ev *oaiserve.KVEventsOptions
	if events {
		ev = &oaiserve.KVEventsOptions{Replay: true}
	}
	var srv *oaiserve.Server
	switch engine {
	case "vllm":
		srv = vllm.Start(vllm.Options{Model: s.Model, DataParallelSize: dp, PromptTokensDetails: true, BlockSize: bs, GPUBlocks: o.GPUBlocks, KVEvents: ev, PD: pd})
	case "sglang":
		srv = sglang.Start(sglang.Options{Model: s.Model, DPSize: dp, CacheReport: true, PageSize: bs, GPUBlocks: o.GPUBlocks, KVEvents: ev, PD: pd})
	default:
		return nil, fmt.Errorf("%s: engine %q: no stand-in", name, engine)
	}
	s.Servers[name] = srv
	return srv, nil
}

// StartEdges starts three edges from the example m as published (peers:
// its peers' ids, from CheckComplete) on loopback addresses and waits until
// they form one Raft group of three voters with a leader and every edge is
// ready; the example's engines are the caller's (o.EdgeConfig points the
// edges at them). Close stops the edges.
func StartEdges(ctx context.Context, m map[string]any, peers []string, o Options) (*Stack, error) {
	s := stackFor(m)
	if err := s.startEdges(ctx, m, peers, o); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// startEdges starts three edges from m with loopback addresses.
func (s *Stack) startEdges(ctx context.Context, m map[string]any, peers []string, o Options) error {
	lns := make([]net.Listener, 3)
	addrs := make([]string, 3)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		lns[i], addrs[i] = ln, ln.Addr().String()
	}
	dir, err := os.MkdirTemp("", "pdstack-")
	if err != nil {
		return err
	}
	s.dir = dir
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s.Edges = make([]*edge.Edge, 3)
	for i := range 3 {
		cfg, err := edgeConfig(m, i, peers, addrs, dir, o)
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		e, err := edge.New(cfg, edge.Deps{Logger: log.With("edge", peers[i]), Registry: prometheus.NewRegistry(),
			HTTPListener: ln, ClusterListener: lns[i], Version: "pdstack"})
		if err != nil {
			return fmt.Errorf("edge %d: %w", i+1, err)
		}
		s.Edges[i] = e
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, e := range s.Edges {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			errs[i] = e.Start(sctx)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	timeout := o.ReadyTimeout
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	return s.waitReady(ctx, timeout)
}

// edgeConfig is edge i's configuration: the example m with its cluster
// section on loopback (peers at addrs, its data dir below dir), the
// trusted gateway on loopback, the words tokenizer for a model's own
// tokenizer (its directory is not here), and the caller's EdgeConfig.
func edgeConfig(m map[string]any, i int, peers, addrs []string, dir string, o Options) (edge.Config, error) {
	c := DeepCopy(m).(map[string]any)
	c["hostname"], c["port"] = "127.0.0.1", 0
	cl := c["cluster"].(map[string]any)
	cl["node_id"] = peers[i]
	cl["bind_addr"], cl["advertise_addr"] = addrs[i], addrs[i]
	cl["data_dir"] = filepath.Join(dir, peers[i])
	var ps []any
	for j := range peers {
		ps = append(ps, map[string]any{"id": peers[j], "addr": addrs[j]})
	}
	cl["peers"] = ps
	if tg, ok := c["trusted_gateway"].(map[string]any); ok {
		tg["cidrs"] = []any{"127.0.0.0/8"}
	}
	for _, f := range fleets(c) {
		if tok, _ := f.m["tokenizer"].(string); strings.HasPrefix(tok, "hf:") {
			// hf: tokenizers are tested by edge/tokenize/tokenize_test.go.
			f.m["tokenizer"] = "words"
		}
	}
	if o.EdgeConfig != nil {
		o.EdgeConfig(c)
	}
	b, err := yaml.Marshal(c)
	if err != nil {
		return edge.Config{}, err
	}
	cfg, err := edge.ParseConfig(b)
	if err != nil {
		return edge.Config{}, fmt.Errorf("edge %d from the example: %w\n%s", i+1, err, b)
	}
	cfg.Telemetry.ProbeInterval = min(cfg.Telemetry.ProbeInterval, 200*time.Millisecond)
	return cfg, nil
}

// waitReady waits for one Raft group of three voters with a leader and
// every edge ready.
func (s *Stack) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: 5 * time.Second}
	for {
		leaders, ready := 0, 0
		for _, e := range s.Edges {
			st := e.Node().Status()
			if st.IsLeader {
				leaders++
			}
			if st.Leader == "" || len(st.Peers) != 3 || !st.Voter {
				continue
			}
			resp, err := c.Get("http://" + e.Addr() + "/readyz")
			if err != nil {
				continue
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				ready++
			}
		}
		if leaders == 1 && ready == len(s.Edges) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pdstack: %d of %d edges ready (%d leaders) after %s", ready, len(s.Edges), leaders, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Aggregated rewrites a prefill/decode example into the engines'
// aggregated setup on the same servers: every prefill and decode server
// serves whole requests in the context fleet (each with KV events, as the
// example's prefill servers have), the generation fleet is empty.
func Aggregated(text string) (string, error) {
	m, err := ParseExample(text)
	if err != nil {
		return "", err
	}
	fs := fleets(m)
	if len(fs) != 2 {
		return "", errors.New("not a prefill/decode example: want context_servers and generation_servers")
	}
	ctx, gen := fs[0], fs[1]
	var events map[string]any
	for i := range ctx.urls {
		um, _ := entry(ctx, i)
		if ev, ok := um["kv_events"].(map[string]any); ok && events == nil {
			events = ev
		}
	}
	for i := range gen.urls {
		um, _ := entry(gen, i)
		if events != nil {
			um["kv_events"] = DeepCopy(events)
		}
		ctx.urls = append(ctx.urls, um)
	}
	for _, u := range ctx.urls {
		delete(u.(map[string]any), "bootstrap_port")
	}
	ctx.m["urls"] = ctx.urls
	delete(m, "generation_servers")
	b, err := yaml.Marshal(m)
	return string(b), err
}

// internalKey signs the emulated deployment's hints (edges and workers).
const internalKey = "pdstack-internal-key-0123456789abcdef"

// StartEmulated starts the example's prefill and decode servers without a
// KV connector, each data-parallel rank a server of its own, behind tether
// workers in proxy mode (one per example server, one upstream per rank,
// reading their engines' KV events) that register over NATS with three
// edges of engine tether: the proxy's emulated disaggregation, which
// computes every prompt twice.
func StartEmulated(ctx context.Context, text string, o Options) (*Stack, error) {
	s, m, peers, err := parseStack(text)
	if err != nil {
		return nil, err
	}
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		return nil, err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("pdstack: NATS did not start")
	}
	s.nats = ns
	fs := fleets(m)
	for _, f := range fs {
		for i := range f.urls {
			if err := s.startProxyWorker(ctx, f, i, o); err != nil {
				s.Close()
				return nil, err
			}
		}
		// The edges find the workers over NATS: tether workers, no URLs.
		f.m["engine"] = "tether"
		f.m["num_instances"] = len(f.urls)
		for _, k := range []string{"urls", "data_parallel_size", "tokenizer", "health_check_model"} {
			delete(f.m, k)
		}
		f.m["block_size"] = max(f.bs, 1)
	}
	m["nats"] = map[string]any{"urls": []any{ns.ClientURL()}}
	m["internal_request_auth_key"] = internalKey
	if err := s.startEdges(ctx, m, peers, o); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// startProxyWorker starts the tether worker in proxy mode that stands for
// server i of fleet f: one emulated engine server per data-parallel rank as
// its upstreams, their KV events read, registered over the stack's NATS.
func (s *Stack) startProxyWorker(ctx context.Context, f fleet, i int, o Options) error {
	fleetName := telemetry.FleetContext
	if f.key == "generation_servers" {
		fleetName = telemetry.FleetGeneration
	}
	ranks := max(f.dp, 1)
	_, name := entry(f, i)
	wc := worker.DefaultConfig()
	wc.InstanceID, wc.Model, wc.Fleet = name, s.Model, fleetName
	wc.InternalRequestAuthKey = internalKey
	wc.Hostname, wc.Port = "127.0.0.1", 0
	wc.NATS.URLs = []string{s.nats.ClientURL()}
	wc.TelemetryInterval = 100 * time.Millisecond
	wc.Ranks = ranks
	wc.ADP.EnableAttentionDP = ranks > 1
	wc.ADP.AttentionDP.ConversationAffinity = true
	wc.Engine.Type = "proxy"
	wc.Engine.EmulateDisaggregation = true
	wc.Engine.BlockSize = max(f.bs, 1)
	var pubs, replays []string
	for r := range ranks {
		srv, err := s.startServer(f.engine, fmt.Sprintf("%s-rank-%d", name, r), 1, f.bs, true, nil, o)
		if err != nil {
			return err
		}
		wc.Engine.Upstreams = append(wc.Engine.Upstreams, srv.URL())
		wc.Engine.UpstreamMetrics = append(wc.Engine.UpstreamMetrics, srv.URL()+"/metrics")
		pub, replay := srv.KVEventsEndpoints()
		pubs, replays = append(pubs, pub), append(replays, replay)
	}
	wc.Engine.KVEvents = worker.KVEventsConfig{Format: f.engine, Endpoints: pubs, ReplayEndpoints: replays, PollInterval: wc.Engine.KVEvents.PollInterval}
	wc.Logger = slog.New(slog.DiscardHandler)
	if o.Logger != nil {
		wc.Logger = o.Logger.With("worker", name)
	}
	w, err := worker.New(wc)
	if err != nil {
		return fmt.Errorf("worker %s: %w", name, err)
	}
	if err := w.Start(ctx); err != nil {
		return fmt.Errorf("worker %s: %w", name, err)
	}
	s.workers = append(s.workers, w)
	return nil
}

// DeepCopy copies a decoded YAML value (maps and lists all the way down).
func DeepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = DeepCopy(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = DeepCopy(e)
		}
		return out
	}
	return v
}
