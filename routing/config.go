package routing

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/tether-project/tether/internal/convid"
	"github.com/tether-project/tether/internal/prefix"
	"github.com/tether-project/tether/routing/breaker"
	"github.com/tether-project/tether/routing/kvindex"
	"github.com/tether-project/tether/routing/workset"
)

// RouterType is a fleet's router (config key router.type). The zero value
// is RouterConversation.
type RouterType uint8

const (
	// RouterConversation binds routing keys to instances through the
	// affinity log (sticky), places new keys by KV-aware score and load,
	// and places unkeyed requests the same way without binding.
	RouterConversation RouterType = iota
	// RouterRoundRobin cycles through the healthy instances (the edge
	// owns the counter). No bindings.
	RouterRoundRobin
	// RouterLoadBalancing sends every request to the least-loaded
	// instance. No bindings, no cache credit.
	RouterLoadBalancing
	// RouterKVCacheAware places every request by KV-aware score and load.
	// No bindings: the KV index alone remembers where prefixes live.
	RouterKVCacheAware
)

var routerTypeNames = [...]string{"conversation", "round_robin", "load_balancing", "kv_cache_aware"}

func (t RouterType) String() string {
	if int(t) < len(routerTypeNames) {
		return routerTypeNames[t]
	}
	return fmt.Sprintf("router_type(%d)", uint8(t))
}

// ParseRouterType parses the router.type config value ("" means
// conversation). Matching is exact after trimming white space and lowering
// case.
func ParseRouterType(s string) (RouterType, error) {
	v := strings.ToLower(strings.TrimSpace(s))
	if v == "" {
		return RouterConversation, nil
	}
	for i, name := range routerTypeNames {
		if v == name {
			return RouterType(i), nil
		}
	}
	return 0, fmt.Errorf("router.type: unknown value %q (allowed: %s)", s, strings.Join(routerTypeNames[:], ", "))
}

// UnmarshalText lets YAML/JSON configs carry the type by name.
func (t *RouterType) UnmarshalText(b []byte) error {
	v, err := ParseRouterType(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}

// MarshalText writes the type's name.
func (t RouterType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// Binds reports whether the router records key bindings in the affinity
// log (sticky routing and overflow apply only then).
func (t RouterType) Binds() bool { return t == RouterConversation }

// usesCache reports whether placement credits cached prefixes.
func (t RouterType) usesCache() bool { return t == RouterConversation || t == RouterKVCacheAware }

// Scope is subagent_affinity_scope: which fleets route a sub-agent by its
// parent's root key. The zero value is ScopeContext (the default).
type Scope uint8

const (
	// ScopeContext: the context fleet routes by the root key; the
	// generation fleet by the child's own conversation id.
	ScopeContext Scope = iota
	// ScopeBoth: both fleets route by the root key.
	ScopeBoth
)

func (s Scope) String() string {
	switch s {
	case ScopeContext:
		return "context"
	case ScopeBoth:
		return "both"
	}
	return fmt.Sprintf("scope(%d)", uint8(s))
}

// ParseScope parses subagent_affinity_scope ("" means context).
func ParseScope(s string) (Scope, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "context":
		return ScopeContext, nil
	case "both":
		return ScopeBoth, nil
	}
	return 0, fmt.Errorf("subagent_affinity_scope: unknown value %q (allowed: context, both)", s)
}

// UnmarshalText lets YAML/JSON configs carry the scope by name.
func (s *Scope) UnmarshalText(b []byte) error {
	v, err := ParseScope(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// MarshalText writes the scope's name.
func (s Scope) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Priority is a request's urgency, from the PriorityHeader. The zero value
// is PriorityNormal.
type Priority uint8

const (
	PriorityNormal Priority = iota
	// PriorityInteractive: someone is waiting; queueing delay weighs
	// more (Weights.InteractiveQueueFactor).
	PriorityInteractive
	// PriorityBackground: nobody is waiting; cache affinity weighs more
	// (Weights.BackgroundCacheFactor).
	PriorityBackground
)

// PriorityHeader is the request header carrying a Priority.
const PriorityHeader = "X-Tether-Priority"

func (p Priority) String() string {
	switch p {
	case PriorityNormal:
		return "normal"
	case PriorityInteractive:
		return "interactive"
	case PriorityBackground:
		return "background"
	}
	return fmt.Sprintf("priority(%d)", uint8(p))
}

// ErrUnknownPriority is wrapped by ParsePriority's error.
var ErrUnknownPriority = errors.New("unknown priority")

// ParsePriority parses a priority value: "" (absent) is PriorityNormal;
// "interactive" and "background" (any case, trimmed) are accepted, and
// "batch" is background (the edge's flow control calls its band so); anything
// else is an error wrapping ErrUnknownPriority, which the edge answers with
// 400. Rejecting rather than defaulting is deliberate: the header is opt-in,
// so only a client that meant to set it sends it, and a typo that silently
// became "normal" would hide a mis-tuned client.
func ParsePriority(s string) (Priority, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "":
		return PriorityNormal, nil
	case "interactive":
		return PriorityInteractive, nil
	case "background", "batch":
		return PriorityBackground, nil
	}
	return PriorityNormal, fmt.Errorf("%w %q (allowed: interactive, batch, background)", ErrUnknownPriority, s)
}

// PriorityFromHeader parses the PriorityHeader of h (first non-blank value),
// the request's header as net/http keeps it (an http.Header; routing does no
// I/O and imports no network package).
func PriorityFromHeader(h map[string][]string) (Priority, error) {
	p, err := ParsePriority(convid.Header(h, PriorityHeader))
	if err != nil {
		return p, fmt.Errorf("header %s: %w", PriorityHeader, err)
	}
	return p, nil
}

// Weights turn cache credit and load into one score, in token-equivalents of
// prefill work (higher is better):
//
//	score = Cache·cf·(cachedTokens + OffloadedBlock·offloadedTokens) − qf·(Queue·backlog + QueuedRequest·queuedRequests) − Decode·activePromptTokens − Evict·evictedTokens [− LiveBinding·liveBindings]
//
// where cf = BackgroundCacheFactor for background requests (else 1), qf =
// InteractiveQueueFactor for interactive requests (else 1), cachedTokens
// the prompt's leading tokens in GPU memory and offloadedTokens the ones
// after those that only an offloaded tier (CPU memory, disk) holds. backlog
// is the prefill work queued ahead on the instance (Router's backlog:
// what the edges dispatched since its last report, plus its reported
// queued requests' prompts discounted by its hit rate); evictedTokens the
// prompt tokens it would have to store beyond what its KV cache has left
// after the working set of the other conversations routed there lately
// (routing/workset): the cache those conversations lose to it. The
// liveBindings term (the instance's live bindings in the log) counts for a
// new key's placement only.
type Weights struct {
	Cache                  float64 `yaml:"cache"`
	Queue                  float64 `yaml:"queue"`
	Decode                 float64 `yaml:"decode"`
	QueuedRequest          float64 `yaml:"queued_request"`
	InteractiveQueueFactor float64 `yaml:"interactive_queue_factor"`
	BackgroundCacheFactor  float64 `yaml:"background_cache_factor"`
	// LoRALoad is what loading a request's LoRA adapter costs on an
	// instance that does not hold it; LoRAFull is added when every
	// adapter slot there is taken by adapters with running requests (the
	// request waits for one to drain). Both in token-equivalents of
	// prefill (routing/lora.go).
	LoRALoad float64 `yaml:"lora_load"`
	LoRAFull float64 `yaml:"lora_full"`
	// OffloadedBlock is what a prompt token held only in an offloaded
	// tier is worth, as a fraction of one held in GPU memory (0..1; 0
	// ignores offloaded tiers). The engine loads such blocks back over
	// PCIe (or from disk) instead of recomputing them: cheaper than
	// prefill, dearer than a GPU hit.
	OffloadedBlock float64 `yaml:"offloaded_block"`
	// Evict is what a prompt token the instance must store beyond its
	// free KV budget costs: another conversation's cached token it
	// evicts, which that conversation computes again on its next turn
	// (1: one evicted token costs one token of prefill; 0 ignores the
	// working sets).
	Evict float64 `yaml:"evict"`
	// LiveBinding is what each live binding on an instance costs a new
	// key placed there: a conversation that keeps sending turns, whose
	// prefills and cache the new one shares. Large against the queue terms
	// by default, so new conversations spread by how many an instance
	// already holds (what no queue shows yet when they arrive together)
	// unless cache or queue differ by more (0: fewest bindings breaks ties
	// only).
	LiveBinding float64 `yaml:"live_binding"`
}

// DefaultLiveBinding is weights.live_binding: about a conversation turn's
// prompt (30,000 tokens).
const DefaultLiveBinding = 30_000

// DefaultOffloadedBlock credits an offloaded token at half a GPU-cached
// one: loading a block from host memory costs a fraction of its prefill
// on current GPUs, but the transfer competes with the engine's other
// loads and the tier's contents are reported later than the GPU's.
const DefaultOffloadedBlock = 0.5

// OverflowConfig says when a bound key leaves its instance. Zero thresholds
// are disabled.
type OverflowConfig struct {
	// QueuedRequests: an instance is saturated at or above this many
	// queued requests (0, the default: never by count). A saturated
	// instance is placed on after those that are not; a key bound to it
	// leaves only when waiting there costs more than moving (ReliefFactor).
	QueuedRequests int `yaml:"queued_requests"`
	// ActivePromptTokens: ... or at or above this many active prompt
	// tokens (0, the default: never by tokens).
	ActivePromptTokens int64 `yaml:"active_prompt_tokens"`
	// ReliefFactor: a healthy bound instance keeps its key unless staying
	// costs more than this many times moving, each in prefill tokens: the
	// prefill queued ahead there (backlog) plus the prompt's part its
	// cache lacks, against the same for the best other instance plus the
	// cache the prompt would evict there (Router.relieve). A move makes
	// the fleet compute the conversation again and reports are 100 ms old,
	// hence a factor well above 1. 0 disables; else at least 1.
	ReliefFactor float64 `yaml:"relief_factor"`
	// RebindAfter: an overflow becomes a rebind once the bound instance
	// has been continuously unable to take its keys this long (0: never
	// rebind; the key returns when the instance recovers).
	RebindAfter time.Duration `yaml:"rebind_after"`
	// CacheLostBelow: a bound key whose instance no longer holds the
	// block at this fraction of the blocks of the conversation's previous
	// prompt there, as this edge saw it (its first block when this edge
	// did not; by the KV index, and only while the index has a trusted
	// baseline for the instance: see Router.cacheLost) is placed again among
	// all instances, the bound one included; when another scores strictly
	// better the binding moves there (an Overflow with Rebind, reason
	// cache_lost). 0 disables; the check runs only for routers that use
	// the cache.
	CacheLostBelow float64 `yaml:"cache_lost_below"`
	// CacheLostMinIdle: the cache-lost check waits until the binding has
	// been idle (log time of its last Bind/Touch/Overflow) this long. Until
	// then a missing block is no evidence: the worker reports the blocks a
	// request stored at its next telemetry flush, and a conversation's next
	// turn can reach another edge first. 0 checks at once.
	CacheLostMinIdle time.Duration `yaml:"cache_lost_min_idle"`
	// SubAgentCacheLost: a sub-agent whose own context its parent's
	// instance no longer holds (the cache-lost check on the child's prompt,
	// once its parent link is committed) is placed under its own
	// conversation id when another instance scores strictly better for it,
	// and follows that binding from then on (decide.go: escape). Off:
	// sub-agents always follow their parent's binding (the default: on the
	// trace benchmark's tuning half it raised the sub-agent hit rate but
	// lowered the hit rate; BENCHMARKS.md).
	SubAgentCacheLost bool `yaml:"subagent_cache_lost"`
	// SubAgentTreeBudget: a sub-agent past its first request that would
	// follow its parent's binding goes its own way when it does not fit
	// the parent's instance — the working set routed there lately (the
	// parent's, its siblings' and every other conversation's prompts)
	// plus its prompt above the instance's KV capacity — and another
	// instance has room for it beside its own working set. It is then
	// placed under its own conversation id (policy subagent_own) and
	// follows that binding from then on (decide.go: treeFits). The
	// contract's affinity is best effort: siblings whose long contexts
	// outgrow one cache evict each other there. On by
	// default (the trace benchmark: sub-agent hit rate up at both loads,
	// hit rate unchanged; BENCHMARKS.md). Off: every request follows
	// the parent.
	SubAgentTreeBudget bool `yaml:"subagent_tree_budget"`
	// SubAgentFirstWithParent: a sub-agent follows its parent's binding on
	// its first request only (where its siblings' shared prefix is); once
	// its parent link is committed it is placed under its own conversation
	// id (its own context's cache, the queue and the working sets weighed;
	// policy subagent_own) and follows that binding (decide.go:
	// ownAfterFirst). Off (the default, docs/subagent-routing.md's
	// contract): sub-agents follow the parent on every request. On the
	// trace benchmark's tuning half at 4 × 3,000 blocks it raised the
	// sub-agent hit rate from 0.687 to 0.742 at an unchanged hit rate
	// (BENCHMARKS.md).
	SubAgentFirstWithParent bool `yaml:"subagent_first_with_parent"`
	// Weigh (experimental, not a configuration key; the trace benchmark's
	// tether_weigh): a healthy bound instance, saturated or not, is
	// weighed against the others per request — each candidate's score is
	// its cached prompt tokens minus the prefill queued ahead (the placement
	// score, bound instance included) — and the key moves (Rebind) when
	// another instance scores strictly better, instead of the saturation
	// thresholds and the cache-lost fraction deciding. The binding must have
	// been idle CacheLostMinIdle (its cache evidence is late before).
	Weigh bool `yaml:"-"`
}

// ShedConfig says when a request is refused (429). Zero limits are
// disabled. A candidate at or above a limit is "over its hard limit"; when
// every candidate is, the request is shed.
type ShedConfig struct {
	// MaxBacklogSeconds: an instance is over its hard limit when the
	// prefill work queued ahead on it (its backlog, as placement and
	// relief estimate it: the prompts dispatched since its last report
	// plus its reported queue's uncached share) would take at least this
	// many seconds at PrefillTokensPerSecond. The limit is in work, not
	// requests: a queue of cached turns waits milliseconds however long it
	// is, and one prompt larger than the cache waits minutes. A queued
	// request whose size its worker does not report (an engine scraped for
	// request counts only) counts nothing toward it: a fleet of such
	// engines sheds by MaxQueuedRequests. Default DefaultMaxBacklogSeconds;
	// 0 disables.
	MaxBacklogSeconds float64 `yaml:"max_backlog_seconds"`
	// MaxQueuedRequests: ... or at or above this many queued requests
	// (0, the default: never by count).
	MaxQueuedRequests int `yaml:"max_queued_requests"`
	// MaxQueuedPrefillTokens: ... or at or above this many prompt tokens
	// the edges dispatched there since its last report (0, the default:
	// never).
	MaxQueuedPrefillTokens int64 `yaml:"max_queued_prefill_tokens"`
	// PrefillTokensPerSecond is an instance's prefill speed: it converts
	// the backlog into seconds (MaxBacklogSeconds) and the work above a
	// limit into the Retry-After estimate. Set it to the engines' speed.
	PrefillTokensPerSecond float64       `yaml:"prefill_tokens_per_second"`
	RetryAfterMin          time.Duration `yaml:"retry_after_min"`
	RetryAfterMax          time.Duration `yaml:"retry_after_max"`
}

// Config is one fleet's routing configuration (the router: section of
// context_servers or generation_servers). Start from DefaultConfig.
type Config struct {
	Type      RouterType `yaml:"type"`
	BlockSize int        `yaml:"block_size"` // tokens per KV block
	// PredictTTL is how long a placed prompt counts as cached on its
	// instance before the worker's stored event (kvindex.Config).
	PredictTTL time.Duration `yaml:"predict_ttl"`
	// WorkingSetWindow is how long a conversation counts in the working
	// set of the instance it was last sent to (routing/workset): what the
	// edge routed within it is what the instances' caches must hold (0:
	// workset.DefaultWindow; not a configuration key).
	WorkingSetWindow time.Duration `yaml:"-"`
	// ReportedPrefill makes the backlog (the prefill queued ahead on an
	// instance: relief's wait and move cost, the hard limit, an unkeyed
	// request's placement; a new key's placement keeps the estimate) the
	// prefill the instance's worker reports it has still to compute —
	// running prefills included — where the worker reports it
	// (InstanceView.PrefillReported), instead of the estimate from its
	// request counts. Off by default: it cuts the TTFT tail behind long
	// prefills and costs hit rate in a fleet over capacity, and tail
	// latency in Dynamo's session workload (BENCHMARKS.md).
	ReportedPrefill bool           `yaml:"reported_prefill"`
	Weights         Weights        `yaml:"weights"`
	Overflow        OverflowConfig `yaml:"overflow"`
	Shed            ShedConfig     `yaml:"shed"`
	Breaker         breaker.Config `yaml:"circuit_breaker"`
}

// DefaultReliefFactor is overflow.relief_factor.
const DefaultReliefFactor = 5

// DefaultMaxBacklogSeconds is shed.max_backlog_seconds: four minutes of
// prefill queued ahead on every instance. The hard limit turns away what a
// client will not wait out; it is not a latency target. Agents wait long
// for a model call and take a 429 badly: the OpenAI and Anthropic SDKs
// time a request out after 10 minutes but retry a 429 twice, so a request
// shed three times fails, and one that is retried has lost its place in
// the queue to the requests that came meanwhile. Four minutes of wait
// leaves most of those 10 minutes to the request's own prefill and answer.
// Measured (BENCHMARKS.md, the trace replay's overloaded fleet, 4 × 3,000
// blocks, TTFT p50 85 s): at 30 s the limit shed 36,470 times for 3,776
// requests and doubled the TTFT p99 (277 → 533 s), at 60 s 458 s, at
// 120 s the sub-agents' hit rate fell 3 points; from 240 s no paired
// figure differs from the former limit of 64 queued requests. A busy but healthy fleet is far below it: Dynamo's session
// workload, ~128 requests in flight per worker, queues under 2 s. Behind a
// proxy that closes a connection silent for 60 s (nginx's
// proxy_read_timeout, an AWS load balancer's idle timeout) a request that
// waits longer fails there: set the limit below that.
const DefaultMaxBacklogSeconds = 240

// DefaultConfig returns the defaults. The weights make one cached token worth
// one queued prefill token (both are prefill work saved or waited for); a
// decoding prompt token slows prefill a tenth as much; a queued request costs
// 256 tokens on top of its tokens (scheduling and the signal when a worker
// does not report token figures). Interactive requests count queueing twice,
// background requests count cache twice. A prompt token that evicts another
// conversation's working set costs the prefill it will redo; a live binding
// costs a new conversation about a turn's prompt. A bound key moves for its
// queue only when waiting costs five times moving. 5,500 prefill tokens/s
// is a 70B-class model on one GPU.
func DefaultConfig() Config {
	return Config{
		Type:             RouterConversation,
		BlockSize:        prefix.DefaultBlockSize,
		PredictTTL:       kvindex.DefaultPredictTTL,
		WorkingSetWindow: workset.DefaultWindow,
		Weights: Weights{
			Cache:                  1,
			Queue:                  1,
			Decode:                 0.1,
			QueuedRequest:          256,
			InteractiveQueueFactor: 2,
			BackgroundCacheFactor:  2,
			LoRALoad:               DefaultLoRALoad,
			LoRAFull:               DefaultLoRAFull,
			OffloadedBlock:         DefaultOffloadedBlock,
			Evict:                  1,
			LiveBinding:            DefaultLiveBinding,
		},
		Overflow: OverflowConfig{
			ReliefFactor:       DefaultReliefFactor,
			RebindAfter:        30 * time.Second,
			CacheLostBelow:     0.5,
			CacheLostMinIdle:   5 * time.Second,
			SubAgentTreeBudget: true,
		},
		Shed: ShedConfig{
			MaxBacklogSeconds:      DefaultMaxBacklogSeconds,
			PrefillTokensPerSecond: 5500,
			RetryAfterMin:          time.Second,
			RetryAfterMax:          30 * time.Second,
		},
		Breaker: breaker.DefaultConfig(),
	}
}

// Validate checks every field and names the offending key (relative to the
// fleet's router: section) in its error.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("router.%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if int(c.Type) >= len(routerTypeNames) {
		bad("type", "unknown router type %d (allowed: %s)", uint8(c.Type), strings.Join(routerTypeNames[:], ", "))
	}
	if c.BlockSize < 1 || c.BlockSize > 1<<20 {
		bad("block_size", "must be 1..1048576 tokens, got %d", c.BlockSize)
	}
	if c.PredictTTL < 0 {
		bad("predict_ttl", "must be >= 0, got %s", c.PredictTTL)
	}
	if c.WorkingSetWindow < 0 {
		bad("working_set_window", "must be >= 0 (0: %s), got %s", workset.DefaultWindow, c.WorkingSetWindow)
	}
	c.Weights.validate(bad)
	c.Overflow.validate(bad)
	c.Shed.validate(bad)
	if c.Overflow.QueuedRequests > 0 && c.Shed.MaxQueuedRequests > 0 && c.Overflow.QueuedRequests >= c.Shed.MaxQueuedRequests {
		bad("overflow.queued_requests", "%d must be below shed.max_queued_requests (%d), or overflow never happens before shedding",
			c.Overflow.QueuedRequests, c.Shed.MaxQueuedRequests)
	}
	if err := c.Breaker.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("router.%w", err))
	}
	return errors.Join(errs...)
}

func (w Weights) validate(bad func(key, format string, args ...any)) {
	weight := func(key string, v, min float64) {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < min {
			bad("weights."+key, "must be a finite number >= %g, got %g", min, v)
		}
	}
	weight("cache", w.Cache, 0)
	weight("queue", w.Queue, 0)
	weight("decode", w.Decode, 0)
	weight("queued_request", w.QueuedRequest, 0)
	weight("interactive_queue_factor", w.InteractiveQueueFactor, 1)
	weight("background_cache_factor", w.BackgroundCacheFactor, 1)
	weight("lora_load", w.LoRALoad, 0)
	weight("lora_full", w.LoRAFull, 0)
	weight("evict", w.Evict, 0)
	weight("live_binding", w.LiveBinding, 0)
	if v := w.OffloadedBlock; math.IsNaN(v) || v < 0 || v > 1 {
		bad("weights.offloaded_block", "must be a fraction 0..1 (0 ignores offloaded tiers), got %g", v)
	}
}

func (o OverflowConfig) validate(bad func(key, format string, args ...any)) {
	if o.QueuedRequests < 0 {
		bad("overflow.queued_requests", "must be >= 0 (0 disables), got %d", o.QueuedRequests)
	}
	if o.ActivePromptTokens < 0 {
		bad("overflow.active_prompt_tokens", "must be >= 0 (0 disables), got %d", o.ActivePromptTokens)
	}
	if v := o.ReliefFactor; math.IsNaN(v) || math.IsInf(v, 0) || (v != 0 && v < 1) {
		bad("overflow.relief_factor", "must be 0 (disabled) or a finite number >= 1, got %g", v)
	}
	if o.RebindAfter < 0 {
		bad("overflow.rebind_after", "must be >= 0 (0 disables), got %s", o.RebindAfter)
	}
	if v := o.CacheLostBelow; math.IsNaN(v) || v < 0 || v > 1 {
		bad("overflow.cache_lost_below", "must be a fraction 0..1 (0 disables), got %g", v)
	}
	if o.CacheLostMinIdle < 0 {
		bad("overflow.cache_lost_min_idle", "must be >= 0 (0: check at once), got %s", o.CacheLostMinIdle)
	}
}

func (sc ShedConfig) validate(bad func(key, format string, args ...any)) {
	if v := sc.MaxBacklogSeconds; math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		bad("shed.max_backlog_seconds", "must be a finite number of seconds >= 0 (0 disables), got %g", v)
	}
	if sc.MaxQueuedRequests < 0 {
		bad("shed.max_queued_requests", "must be >= 0 (0 disables), got %d", sc.MaxQueuedRequests)
	}
	if sc.MaxQueuedPrefillTokens < 0 {
		bad("shed.max_queued_prefill_tokens", "must be >= 0 (0 disables), got %d", sc.MaxQueuedPrefillTokens)
	}
	if tps := sc.PrefillTokensPerSecond; math.IsNaN(tps) || math.IsInf(tps, 0) || tps <= 0 {
		bad("shed.prefill_tokens_per_second", "must be a finite number > 0, got %g", tps)
	}
	// Retry-After carries whole seconds.
	if d := sc.RetryAfterMin; d < time.Second || d%time.Second != 0 {
		bad("shed.retry_after_min", "must be a whole number of seconds >= 1s, got %s", d)
	}
	if d := sc.RetryAfterMax; d < sc.RetryAfterMin || d%time.Second != 0 {
		bad("shed.retry_after_max", "must be a whole number of seconds >= shed.retry_after_min (%s), got %s", sc.RetryAfterMin, d)
	}
}
