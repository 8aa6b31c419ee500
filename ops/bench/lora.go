package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/worker/engine/sim"
)

// The LoRA benchmark: agents of several types, each type on its own LoRA
// adapter (an agent platform's fine-tuned agent kinds), over a fleet whose
// instances hold a few adapters each. Where a request lands decides both
// its cache (an adapter's blocks are its own) and whether the engine must
// first load the adapter (the load time on the request's TTFT, and on the
// instance's queue).

// LoRAOptions shape the LoRA workload.
type LoRAOptions struct {
	Types         int           // adapter (agent) types (default 8)
	AgentsPerType int           // root conversations per type (default 24)
	Turns         int           // requests per root conversation (default 6)
	SubAgents     int           // sub-agents per root, launched after turn 2, same type (default 2)
	SubTurns      int           // requests per sub-agent (default 3)
	BlockSize     int           // default 64
	OutputTokens  int           // default 64
	Spread        time.Duration // root conversations start uniformly within it (default 60s)
	Think         time.Duration // least time between a conversation's turns (default 2s)
	// TypeWords is the prompt every conversation of a type shares (its
	// tools; default 40 words, within the first block, so no block is
	// shared), OwnWords each
	// conversation's own task context (default 1,000): what an agent type
	// shares is its adapter far more than its prompt.
	TypeWords, OwnWords int
	Seed                uint64 // start offsets
}

func (o *LoRAOptions) defaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.Types, 8)
	def(&o.AgentsPerType, 24)
	def(&o.Turns, 6)
	def(&o.SubAgents, 2)
	def(&o.SubTurns, 3)
	def(&o.BlockSize, prefix.DefaultBlockSize)
	def(&o.OutputTokens, 64)
	def(&o.TypeWords, 40)
	def(&o.OwnWords, 1000)
	if o.Spread <= 0 {
		o.Spread = 60 * time.Second
	}
	if o.Think <= 0 {
		o.Think = 2 * time.Second
	}
}

// LoRAAdapter names agent type k's adapter.
func LoRAAdapter(k int) string { return fmt.Sprintf("agent-type-%d", k) }

// LoRAWorkload builds the workload: per type the tools every conversation
// of the type shares (TypeWords), each conversation's own task context
// (OwnWords) and turns growing by 120 words each, and sub-agents with the
// type's tools and their own instructions; every request names its type's
// adapter and its blocks are the adapter's.
func LoRAWorkload(o LoRAOptions) *Workload {
	o.defaults()
	rng := rand.New(rand.NewPCG(o.Seed, 0x6c6f7261))
	w := &Workload{Name: "lora", BlockSize: o.BlockSize}
	req := func(adapter string, msgs ...prefix.Message) *Request {
		toks := prefix.Tokenize(prefix.RenderChat(msgs))
		blocks := prefix.AdapterBlockHashes(adapter, toks, o.BlockSize)
		return &Request{PromptTokens: len(toks), OutputTokens: o.OutputTokens, Keys: blocks, Blocks: blocks, Messages: msgs, Adapter: adapter}
	}
	conversation := func(id, adapter, system string, turns int) []Step {
		var steps []Step
		var said []string
		for i := 0; i < turns; i++ {
			said = append(said, Words(fmt.Sprintf("%s/turn%d", id, i), 120))
			steps = append(steps, Step{At: time.Duration(i) * o.Think, Request: req(adapter, sys(system), user(strings.Join(said, " ")))})
		}
		return steps
	}
	for k := 0; k < o.Types; k++ {
		adapter := LoRAAdapter(k)
		tools := Words(fmt.Sprintf("lora/type%d/tools", k), o.TypeWords)
		for x := 0; x < o.AgentsPerType; x++ {
			id := fmt.Sprintf("%s-conv-%d", adapter, x)
			system := join(tools, Words(id+"/task", o.OwnWords))
			a := &Agent{ID: id, Kind: adapter, Start: time.Duration(rng.Int64N(int64(o.Spread)))}
			steps := conversation(id, adapter, system, o.Turns)
			split := min(3, len(steps))
			a.Steps = append(a.Steps, steps[:split]...)
			for j := 0; j < o.SubAgents; j++ {
				sid := fmt.Sprintf("%s/sub%d", id, j)
				sub := &Agent{ID: sid, Parent: a, Kind: adapter + "/sub"}
				sub.Steps = conversation(sid, adapter, join(tools, Words(sid+"/task", o.OwnWords/2)), o.SubTurns)
				a.Steps = append(a.Steps, Step{SubAgent: sub, WithPrevious: j > 0})
			}
			a.Steps = append(a.Steps, steps[split:]...)
			w.Agents = append(w.Agents, a)
		}
	}
	return w
}

// noteAdapter is the edge's record of an adapter it sent to instance i
// (fleetview.NoteAdapter).
func (e *simEdge) noteAdapter(i int, adapter string, now time.Duration) {
	if adapter == "" {
		return
	}
	for len(e.loraSent) <= i {
		e.loraSent = append(e.loraSent, nil)
	}
	if e.loraSent[i] == nil {
		e.loraSent[i] = map[string]time.Duration{}
	}
	e.loraSent[i][adapter] = now
}

// reportLoRA is the instance's adapters in its load report at at: each
// rank's held adapters and whether all its slots run requests.
func (in *simInstance) reportLoRA(at time.Duration) {
	in.repLoRA = nil
	maxLoRAs := 0
	if len(in.ranks) > 0 {
		maxLoRAs = in.maxLoRAs
	}
	if maxLoRAs == 0 {
		return
	}
	v := &routing.LoRAView{MaxLoRAs: maxLoRAs, Full: true}
	for _, vr := range in.ranks {
		vr.Advance(at)
		held, running := vr.LoRAState()
		v.Loaded = append(v.Loaded, held...)
		if len(running) < maxLoRAs {
			v.Full = false
		}
	}
	sort.Strings(v.Loaded)
	v.Loaded = slices.Compact(v.Loaded)
	in.repLoRA = v
}

// loraView is instance i's adapters as edge e sees them: its last report
// and what e sent there within the prediction lifetime.
func (s *simulator) loraView(e *simEdge, i int, in *simInstance) *routing.LoRAView {
	var sent []string
	if i < len(e.loraSent) {
		ttl := s.router.Config().PredictTTL
		for a, t := range e.loraSent[i] {
			if s.now-t < ttl {
				sent = append(sent, a)
			}
		}
	}
	if in.repLoRA == nil && len(sent) == 0 {
		return nil
	}
	v := &routing.LoRAView{}
	if r := in.repLoRA; r != nil {
		v.MaxLoRAs, v.Full, v.Loaded = r.MaxLoRAs, r.Full, slices.Clone(r.Loaded)
	}
	v.Loaded = append(v.Loaded, sent...)
	sort.Strings(v.Loaded)
	v.Loaded = slices.Compact(v.Loaded)
	return v
}

// LoRABenchConfig is one LoRA benchmark: the workload, the fleet and the
// seeds.
type LoRABenchConfig struct {
	Workload     LoRAOptions
	Instances    int           // default 8
	MaxLoRAs     int           // adapter slots per instance (default 2)
	LoadTime     time.Duration // one adapter load (default the simulated engine's, 100ms)
	Edges        int           // default 3
	Seeds        []uint64      // default 1..5
	LoRAPolicies []LoRAPolicy  // default all
}

// LoRAPolicy is one routing setup of the benchmark.
type LoRAPolicy string

// The compared setups.
const (
	// LoRATether: tether as it ships (the adapter's load weighed in).
	LoRATether LoRAPolicy = "tether"
	// LoRABlind: tether with the LoRA weights at 0 (lora_load, lora_full):
	// conversation affinity and the KV cache still count, adapters not.
	LoRABlind LoRAPolicy = "tether_lora_blind"
	// LoRALeastLoaded: load only.
	LoRALeastLoaded LoRAPolicy = "least_loaded"
	// LoRAIdealEdge: tether with one edge and a zero-latency log (the
	// reference the shared log must reach).
	LoRAIdealEdge LoRAPolicy = "tether (one ideal edge)"
)

// AllLoRAPolicies are the setups in table order.
var AllLoRAPolicies = []LoRAPolicy{LoRATether, LoRABlind, LoRALeastLoaded, LoRAIdealEdge}

// LoRAResult is one policy's figures over the seeds.
type LoRAResult struct {
	Policy LoRAPolicy
	// Per seed: cache hit rate (cached / prompt tokens), adapter loads
	// per 1,000 requests, TTFT mean, p50 and p99, makespan.
	HitRate, LoadsPer1k []float64
	TTFTP50, TTFTP99    []time.Duration
	TTFTMean            []time.Duration
	Makespan            []time.Duration
	Requests            int
}

// RunLoRABench simulates every policy on every seed.
func RunLoRABench(ctx context.Context, c LoRABenchConfig) ([]LoRAResult, error) {
	if c.Instances <= 0 {
		c.Instances = 8
	}
	if c.MaxLoRAs <= 0 {
		c.MaxLoRAs = 2
	}
	if c.LoadTime <= 0 {
		c.LoadTime = sim.DefaultLoRALoadTime
	}
	if c.Edges <= 0 {
		c.Edges = 3
	}
	if len(c.Seeds) == 0 {
		c.Seeds = []uint64{1, 2, 3, 4, 5}
	}
	if len(c.LoRAPolicies) == 0 {
		c.LoRAPolicies = AllLoRAPolicies
	}
	var out []LoRAResult
	for _, p := range c.LoRAPolicies {
		r := LoRAResult{Policy: p}
		for _, seed := range c.Seeds {
			wo := c.Workload
			wo.Seed = seed
			w := LoRAWorkload(wo)
			cfg := DefaultSimConfig()
			cfg.Instances, cfg.Edges, cfg.Seed = c.Instances, c.Edges, seed
			cfg.Engine.MaxLoRAs, cfg.Engine.LoRALoadTime = c.MaxLoRAs, c.LoadTime
			switch p {
			case LoRATether:
			case LoRABlind:
				cfg.Routing.Weights.LoRALoad, cfg.Routing.Weights.LoRAFull = 0, 0
			case LoRALeastLoaded:
				cfg.Policy = PolicyLeastLoaded
			case LoRAIdealEdge:
				cfg.Edges, cfg.Log = 1, LogSequencer
			default:
				return nil, fmt.Errorf("bench: unknown LoRA policy %q", p)
			}
			res, err := Simulate(ctx, w, cfg)
			if err != nil {
				return nil, fmt.Errorf("bench: lora %s seed %d: %w", p, seed, err)
			}
			var prompt, cached, loads int
			ttfts := make([]time.Duration, 0, len(res.Records))
			for _, rec := range res.Records {
				prompt += rec.Prompt
				cached += rec.Cached
				if rec.AdapterLoaded {
					loads++
				}
				ttfts = append(ttfts, rec.TTFT)
			}
			slices.Sort(ttfts)
			r.Requests = len(res.Records)
			r.HitRate = append(r.HitRate, float64(cached)/float64(max(prompt, 1)))
			r.LoadsPer1k = append(r.LoadsPer1k, 1000*float64(loads)/float64(max(len(res.Records), 1)))
			r.TTFTP50 = append(r.TTFTP50, Percentile(ttfts, 0.5))
			r.TTFTP99 = append(r.TTFTP99, Percentile(ttfts, 0.99))
			var sum time.Duration
			for _, v := range ttfts {
				sum += v
			}
			r.TTFTMean = append(r.TTFTMean, sum/time.Duration(max(len(ttfts), 1)))
			r.Makespan = append(r.Makespan, res.Makespan)
		}
		out = append(out, r)
	}
	return out, nil
}

// WriteLoRATable writes the results as a Markdown table: medians over the
// seeds with [min–max].
func WriteLoRATable(w io.Writer, c LoRABenchConfig, rs []LoRAResult) error {
	f := func(vs []float64, format string) string {
		s := slices.Clone(vs)
		slices.Sort(s)
		return fmt.Sprintf(format+" [%s–%s]", median(s), fmt.Sprintf(format, s[0]), fmt.Sprintf(format, s[len(s)-1]))
	}
	d := func(vs []time.Duration) string {
		fs := make([]float64, len(vs))
		for i, v := range vs {
			fs[i] = v.Seconds() * 1000
		}
		return f(fs, "%.0f")
	}
	pct := func(vs []float64) []float64 {
		out := make([]float64, len(vs))
		for i, v := range vs {
			out[i] = 100 * v
		}
		return out
	}
	if _, err := fmt.Fprintf(w, "| policy | hit rate %% | adapter loads / 1,000 requests | TTFT mean ms | TTFT p50 ms | TTFT p99 ms | makespan s |\n|---|---|---|---|---|---|---|\n"); err != nil {
		return err
	}
	for _, r := range rs {
		ms := make([]float64, len(r.Makespan))
		for i, v := range r.Makespan {
			ms[i] = v.Seconds()
		}
		if _, err := fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", r.Policy, f(pct(r.HitRate), "%.1f"), f(r.LoadsPer1k, "%.0f"),
			d(r.TTFTMean), d(r.TTFTP50), d(r.TTFTP99), f(ms, "%.1f")); err != nil {
			return err
		}
	}
	req := 0
	if len(rs) > 0 {
		req = rs[0].Requests
	}
	_, err := fmt.Fprintf(w, "\n%d requests per run; medians over %d seeds [min–max].\n", req, len(c.Seeds))
	return err
}
