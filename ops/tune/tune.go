package tune

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tether-project/tether/ops/bench"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/worker/engine/sim"
)

// Candidate is one configuration to replay.
type Candidate struct {
	Name   string
	Config routing.Config
}

// Options configure the replays.
type Options struct {
	// Base is the configuration the edges ran (routing.DefaultConfig():
	// the shipped one); the candidates change one setting of it each.
	Base routing.Config
	// Candidates to replay besides Base (nil: DefaultCandidates).
	Candidates []Candidate
	// CapacityBlocks and Ranks describe each simulated instance (0: the
	// simulated engine's defaults, what `tether dev` workers run).
	CapacityBlocks, Ranks int
	// TimeScale multiplies the recorded offsets (0: 1). A `tether dev`
	// run at engine time scale 0.1 replays at 10: its engines ran ten
	// times faster than the simulator's.
	TimeScale float64
	Seed      uint64
	// Progress, when set, is told of each finished replay.
	Progress func(done, total int)
}

// Score is what one configuration would have scored on the recorded
// requests.
type Score struct {
	Name string `json:"name"`
	// Rank is 1 for the best (lowest mean time to first token in steps of
	// 1 %, then the highest hit rate).
	Rank    int     `json:"rank"`
	HitRate float64 `json:"hit_rate"`
	// LoadCoV is the coefficient of variation of the prompt tokens each
	// instance computed (0: perfectly even); MaxInstanceShare the busiest
	// instance's share of them.
	LoadCoV          float64 `json:"load_cov"`
	MaxInstanceShare float64 `json:"max_instance_share"`
	TTFTMeanMs       float64 `json:"ttft_mean_ms"`
	TTFTP50Ms        float64 `json:"ttft_p50_ms"`
	TTFTP99Ms        float64 `json:"ttft_p99_ms"`
	Overflows        int     `json:"overflows"`
	Shed             int     `json:"shed"`
}

// Report is `tether audit tune`'s answer.
type Report struct {
	Requests      int      `json:"requests"`
	Conversations int      `json:"conversations"`
	SubAgents     int      `json:"subagents"`
	Instances     []string `json:"instances"`
	Edges         int      `json:"edges"`
	// ProductionHitRate is the engines' own hit rate on these requests.
	// The replays' figures are the simulator's (prompts rebuilt from
	// fingerprints, simulated engines): compare configurations with each
	// other, the base the reference, not with production's.
	ProductionHitRate float64 `json:"production_hit_rate"`
	// Scores, best first; the base configuration is "shipped".
	Scores []Score `json:"scores"`
}

// BaseName names the base configuration's score.
const BaseName = "shipped"

// Run replays rec under the base configuration and every candidate.
func Run(ctx context.Context, rec *Recorded, opts Options) (*Report, error) {
	cands := opts.Candidates
	if cands == nil {
		cands = DefaultCandidates(opts.Base)
	}
	cands = append([]Candidate{{Name: BaseName, Config: opts.Base}}, cands...)
	rep := &Report{Requests: rec.Requests, Conversations: rec.Conversations, SubAgents: rec.SubAgents, Instances: rec.Instances,
		Edges: max(len(rec.Edges), 1), ProductionHitRate: rec.HitRate}
	for i, c := range cands {
		if err := c.Config.Validate(); err != nil {
			return nil, fmt.Errorf("tune: candidate %s: %w", c.Name, err)
		}
		cfg := bench.DefaultSimConfig()
		cfg.Policy, cfg.Routing, cfg.Seed = bench.PolicyTether, c.Config, opts.Seed
		cfg.Edges, cfg.Instances, cfg.InstanceIDs = min(rep.Edges, 64), len(rec.Instances), rec.Instances
		cfg.CapacityBlocks, cfg.Ranks = sim.DefaultCapacityBlocks, 1
		if opts.CapacityBlocks > 0 {
			cfg.CapacityBlocks = opts.CapacityBlocks
		}
		if opts.Ranks > 0 {
			cfg.Ranks = opts.Ranks
		}
		if opts.TimeScale > 0 {
			cfg.TimeScale = opts.TimeScale
		}
		res, err := bench.Simulate(ctx, rec.Workload, cfg)
		if err != nil {
			return nil, fmt.Errorf("tune: replay %s: %w", c.Name, err)
		}
		rep.Scores = append(rep.Scores, score(c.Name, res))
		if opts.Progress != nil {
			opts.Progress(i+1, len(cands))
		}
	}
	rank(rep.Scores)
	return rep, nil
}

func score(name string, res *bench.RunResult) Score {
	s := bench.Summarize(res)
	out := Score{Name: name, HitRate: s.HitRate, LoadCoV: s.LoadCoV, TTFTP50Ms: s.TTFTP50Ms, TTFTP99Ms: s.TTFTP99Ms,
		Overflows: s.Overflows, Shed: s.Shed}
	var sum time.Duration
	for _, r := range res.Records {
		sum += r.TTFT
	}
	if n := len(res.Records); n > 0 {
		out.TTFTMeanMs = float64(sum) / float64(n) / float64(time.Millisecond)
	}
	if s.PrefillTokens > 0 {
		out.MaxInstanceShare = float64(s.MaxInstancePrefillTokens) / float64(s.PrefillTokens)
	}
	return out
}

// ttftStep is the relative step in which mean times to first token are
// compared: a replay of a short recording moves them by less than this
// between configurations that differ only in the noise.
const ttftStep = 0.01

// rank orders scores best first: lower mean time to first token, counted
// in steps of ttftStep of the base configuration's (the reference: the
// base is in the middle of its step, so a candidate within half a step of
// it ties with it), then higher hit rate.
func rank(scores []Score) {
	ref := 0.0
	for _, s := range scores {
		if s.Name == BaseName {
			ref = s.TTFTMeanMs
		}
	}
	step := func(ms float64) int64 {
		if ref <= 0 {
			return int64(math.Round(ms * 1000)) // no reference: to the microsecond
		}
		return int64(math.Round((ms/ref - 1) / ttftStep))
	}
	slices.SortStableFunc(scores, func(a, b Score) int {
		if c := cmp.Compare(step(a.TTFTMeanMs), step(b.TTFTMeanMs)); c != 0 {
			return c
		}
		return cmp.Compare(b.HitRate, a.HitRate)
	})
	for i := range scores {
		scores[i].Rank = i + 1
	}
}

// settings are the keys a candidate can change (routing.Config's YAML
// names, as in the edge's placement section).
var settings = map[string]func(c *routing.Config, v float64){
	"weights.cache":                    func(c *routing.Config, v float64) { c.Weights.Cache = v },
	"weights.queue":                    func(c *routing.Config, v float64) { c.Weights.Queue = v },
	"weights.decode":                   func(c *routing.Config, v float64) { c.Weights.Decode = v },
	"weights.queued_request":           func(c *routing.Config, v float64) { c.Weights.QueuedRequest = v },
	"weights.interactive_queue_factor": func(c *routing.Config, v float64) { c.Weights.InteractiveQueueFactor = v },
	"weights.background_cache_factor":  func(c *routing.Config, v float64) { c.Weights.BackgroundCacheFactor = v },
	"weights.evict":                    func(c *routing.Config, v float64) { c.Weights.Evict = v },
	"weights.live_binding":             func(c *routing.Config, v float64) { c.Weights.LiveBinding = v },
	"overflow.relief_factor":           func(c *routing.Config, v float64) { c.Overflow.ReliefFactor = v },
	"overflow.queued_requests":         func(c *routing.Config, v float64) { c.Overflow.QueuedRequests = int(v) },
	"overflow.active_prompt_tokens":    func(c *routing.Config, v float64) { c.Overflow.ActivePromptTokens = int64(v) },
	"overflow.cache_lost_below":        func(c *routing.Config, v float64) { c.Overflow.CacheLostBelow = v },
	"overflow.rebind_after":            func(c *routing.Config, v float64) { c.Overflow.RebindAfter = time.Duration(v * float64(time.Second)) },
}

// Settings lists the keys ParseSet accepts.
func Settings() []string {
	out := make([]string, 0, len(settings))
	for k := range settings {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// ParseSet parses "key=v1,v2,…" into one candidate per value, each base
// with key set to it (overflow.rebind_after in seconds).
func ParseSet(base routing.Config, spec string) ([]Candidate, error) {
	key, vals, ok := strings.Cut(spec, "=")
	key = strings.TrimSpace(key)
	set := settings[key]
	if !ok || set == nil {
		return nil, fmt.Errorf("tune: --set %q: want key=value[,value…] with key one of %s", spec, strings.Join(Settings(), ", "))
	}
	var out []Candidate
	for _, s := range strings.Split(vals, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("tune: --set %s: %q is not a number", key, s)
		}
		c := base
		set(&c, v)
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("tune: --set %s=%s: %w", key, strings.TrimSpace(s), err)
		}
		out = append(out, Candidate{Name: key + "=" + strings.TrimSpace(s), Config: c})
	}
	return out, nil
}

// DefaultCandidates vary the settings that trade cache affinity against
// load, one at a time around base: the cache weight off, halved, doubled
// and quadrupled; the queue weight halved and doubled; the per-request
// queue cost off and quadrupled; the cache-lost rebind off and at three
// quarters; the relief rule off, halved and doubled (on at its default when
// the base has it off); the request-count threshold halved and doubled when
// the base sets one.
func DefaultCandidates(base routing.Config) []Candidate {
	w, o := base.Weights, base.Overflow
	specs := []string{
		fmt.Sprintf("weights.cache=0,%g,%g,%g", w.Cache/2, w.Cache*2, w.Cache*4),
		fmt.Sprintf("weights.queue=%g,%g", w.Queue/2, w.Queue*2),
		fmt.Sprintf("weights.queued_request=0,%g", w.QueuedRequest*4),
		"overflow.cache_lost_below=0,0.75",
	}
	if o.ReliefFactor > 0 {
		specs = append(specs, fmt.Sprintf("overflow.relief_factor=0,%g,%g", o.ReliefFactor/2, o.ReliefFactor*2))
	} else {
		specs = append(specs, fmt.Sprintf("overflow.relief_factor=%g", float64(routing.DefaultReliefFactor)))
	}
	if o.QueuedRequests > 0 {
		specs = append(specs, fmt.Sprintf("overflow.queued_requests=%d,%d", max(o.QueuedRequests/2, 1), o.QueuedRequests*2))
	}
	var out []Candidate
	for _, s := range specs {
		cs, err := ParseSet(base, s)
		if err != nil {
			continue // a base whose variant is invalid: skip that variant
		}
		out = append(out, cs...)
	}
	return out
}

// WriteText prints the report as a table, best first.
func (rep *Report) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "replayed %d requests (%d conversations, %d sub-agents) from the log on %d instances (%s) behind %d edge(s);\n",
		rep.Requests, rep.Conversations, rep.SubAgents, len(rep.Instances), strings.Join(rep.Instances, ", "), rep.Edges)
	fmt.Fprintf(w, "the engines' own hit rate on them was %.1f%%; the replays rebuild the prompts from fingerprints and run simulated engines:\n"+
		"compare the configurations with each other (%s is the reference), not with production's figures\n\n", 100*rep.ProductionHitRate, BaseName)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RANK\tCONFIGURATION\tHIT RATE\tLOAD COV\tBUSIEST\tTTFT MEAN\tTTFT P50\tTTFT P99\tOVERFLOWS\tSHED")
	for _, s := range rep.Scores {
		fmt.Fprintf(tw, "%d\t%s\t%.1f%%\t%.2f\t%.0f%%\t%.0f ms\t%.0f ms\t%.0f ms\t%d\t%d\n", s.Rank, s.Name, 100*s.HitRate, s.LoadCoV,
			100*s.MaxInstanceShare, s.TTFTMeanMs, s.TTFTP50Ms, s.TTFTP99Ms, s.Overflows, s.Shed)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "\n(ranked by mean time to first token in steps of 1 % of the shipped one's, then hit rate; each candidate changes one setting of the shipped configuration)")
	return err
}
