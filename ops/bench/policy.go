package bench

import (
	"fmt"
	"slices"
	"strings"
)

// Policy is a routing policy the harness compares.
type Policy string

const (
	// PolicyRandom: a uniformly random instance per request (seeded).
	PolicyRandom Policy = "random"
	// PolicyRoundRobin: routing's round_robin router, one counter per edge.
	PolicyRoundRobin Policy = "round_robin"
	// PolicyLeastLoaded: routing's load_balancing router (no cache credit,
	// no bindings).
	PolicyLeastLoaded Policy = "least_loaded"
	// PolicySessionLocal: sticky sessions with a binding table per edge —
	// today's independent router replicas. New sessions by load; each
	// agent keyed by its own session id; no shared log.
	PolicySessionLocal Policy = "session_local"
	// PolicySession: sticky sessions through the shared affinity log, new
	// sessions by load, each agent keyed by its own session id (no parent
	// affinity, no overflow).
	PolicySession Policy = "session"
	// PolicyPrefix: routing's kv_cache_aware router — best prefix match
	// against load, every request placed afresh, with a KV index per edge
	// (workers' KV events plus the edge's own predictions). No bindings.
	PolicyPrefix Policy = "prefix"
	// PolicyTether: the product — shared affinity log, parent-session
	// affinity (sub-agents route by their root and carry the signed hint
	// to the worker's ADP scheduler), KV-aware placement of new keys,
	// overflow and rebinding, the cache circuit breaker.
	PolicyTether Policy = "tether"
	// PolicyTetherLocal: tether's decision with per-edge state — each
	// edge keeps its own binding table (no shared log), its own index and
	// breakers: the "independent replicas" counterpart of tether, as
	// session_local is of session.
	PolicyTetherLocal Policy = "tether_local"
)

// Tether ablations, for investigating where tether wins or loses: the same
// product with one mechanism off. Selected by name only (not in "all").
const (
	// PolicyTetherNoParent: tether without parent-session affinity
	// (sub-agents are keyed by their own session id).
	PolicyTetherNoParent Policy = "tether_no_parent"
	// PolicyTetherNoOverflow: tether without overflow (bound keys always
	// stay).
	PolicyTetherNoOverflow Policy = "tether_no_overflow"
	// PolicyTetherParentFirst: tether, but the agent gateway sends the
	// parent header only on a sub-agent's first request: the first call
	// lands with its parent and siblings (their shared prefix), later
	// calls route by the sub-agent's own key (KV-aware placement, then
	// sticky). A proposal, not the contract's behaviour (docs/subagent-routing.md) (which keeps the
	// header on every turn).
	PolicyTetherParentFirst Policy = "tether_parent_first"
	// PolicyTetherNoCacheRebind: tether without the cache-lost rebind
	// (routing's overflow.cache_lost_below = 0): a key stays on its bound
	// instance after that instance's cache of it was evicted.
	PolicyTetherNoCacheRebind Policy = "tether_no_cache_rebind"
	// PolicyTetherWeigh: tether with routing's experimental per-request
	// weighing of the bound instance against the others
	// (OverflowConfig.Weigh) instead of the thresholds.
	PolicyTetherWeigh Policy = "tether_weigh"
	// PolicyTetherNoRelief: tether without the relief rule (routing's
	// overflow.relief_factor 0): a bound key leaves a healthy instance
	// only when it lost the conversation's cache.
	PolicyTetherNoRelief Policy = "tether_no_relief"
	// PolicyTetherNoTreeBudget: tether without the agent tree's KV budget
	// (routing's overflow.subagent_tree_budget off): every request of a
	// sub-agent follows its parent's binding, however full the parent's
	// instance.
	PolicyTetherNoTreeBudget Policy = "tether_no_tree_budget"
	// PolicyTetherNoWorkingSet: tether without the working sets' eviction
	// cost (weights.evict 0): placement does not weigh the cache a prompt
	// evicts.
	PolicyTetherNoWorkingSet Policy = "tether_no_working_set"
	// PolicyTetherNoSpread: tether without the live-binding cost of a new
	// key's placement (weights.live_binding 0).
	PolicyTetherNoSpread Policy = "tether_no_spread"
	// PolicyTetherFirstWithParent: tether with sub-agents following their
	// parent's binding on their first request only, then bound under
	// their own ids (routing's overflow.subagent_first_with_parent, off by
	// default) — tether_parent_first's effect decided by the router
	// instead of the gateway.
	PolicyTetherFirstWithParent Policy = "tether_first_with_parent"
	// PolicyTetherQueuedLimit: tether with the hard limit counted in
	// queued requests (shed.max_queued_requests 64, max_backlog_seconds
	// 0), the default before the limit was counted in seconds of prefill.
	PolicyTetherQueuedLimit Policy = "tether_queued_limit"
	// PolicyTetherReportedPrefill: tether whose backlog is the prefill the
	// workers report still to compute, running prefills included
	// (placement.reported_prefill), instead of the estimate from their
	// request counts.
	PolicyTetherReportedPrefill Policy = "tether_reported_prefill"
	// PolicyTetherOwnWorkingSets: tether whose edges weigh only their own
	// routes in the working sets (no Share.WorkingSets), as before the
	// edges told each other theirs.
	PolicyTetherOwnWorkingSets Policy = "tether_own_worksets"
	// PolicyTetherOwnOverload: tether with each edge's overload history
	// its own (the edges do not tell each other its transitions; the
	// shipped edges do: edge/route/strain.go).
	PolicyTetherOwnOverload Policy = "tether_own_overload"
)

// TetherVariants are the ablations.
var TetherVariants = []Policy{PolicyTetherNoParent, PolicyTetherNoOverflow, PolicyTetherParentFirst, PolicyTetherNoCacheRebind, PolicyTetherWeigh,
	PolicyTetherNoRelief, PolicyTetherNoTreeBudget, PolicyTetherNoWorkingSet, PolicyTetherNoSpread, PolicyTetherFirstWithParent,
	PolicyTetherQueuedLimit, PolicyTetherReportedPrefill, PolicyTetherOwnWorkingSets, PolicyTetherOwnOverload}

func (p Policy) isTether() bool {
	return p == PolicyTether || p == PolicyTetherLocal || slices.Contains(TetherVariants, p)
}

// AllPolicies lists every policy in report order.
var AllPolicies = []Policy{PolicyRandom, PolicyRoundRobin, PolicyLeastLoaded, PolicySessionLocal, PolicySession, PolicyPrefix,
	PolicyDynamo, PolicyLLMD, PolicySMG, PolicyTRTLLMConversation, PolicyTetherLocal, PolicyTether}

// usesSharedLog reports whether the policy keeps bindings in the shared
// affinity log (its commits are counted).
func (p Policy) usesSharedLog() bool {
	return p == PolicySession || (p.isTether() && p != PolicyTetherLocal)
}

// local reports whether each edge keeps its own binding table.
func (p Policy) local() bool { return p == PolicySessionLocal || p == PolicyTetherLocal }

// binds reports whether the policy keys requests by conversation.
func (p Policy) binds() bool { return p == PolicySession || p == PolicySessionLocal || p.isTether() }

// usesKVIndex reports whether edges keep a KV index for the policy.
func (p Policy) usesKVIndex() bool {
	return p == PolicyPrefix || p.isTether() || p == PolicyDynamo || p == PolicyDynamoKV || p == PolicyLLMD
}

// ParsePolicies parses a comma-separated policy list; "all" stands for
// every policy of AllPolicies (the ablations are named explicitly).
func ParsePolicies(list string) ([]Policy, error) {
	var out []Policy
	seen := map[Policy]bool{}
	for _, f := range strings.Split(list, ",") {
		name := Policy(strings.TrimSpace(f))
		if name == "" {
			continue
		}
		if name == "all" {
			for _, p := range AllPolicies {
				if !seen[p] {
					seen[p] = true
					out = append(out, p)
				}
			}
			continue
		}
		known := false
		all := slices.Concat(AllPolicies, TetherVariants, PeerPolicies)
		for _, p := range all {
			known = known || p == name
		}
		if !known {
			names := make([]string, len(all))
			for i, p := range all {
				names[i] = string(p)
			}
			return nil, fmt.Errorf("bench: --policies: unknown policy %q (allowed: %s, or all)", name, strings.Join(names, ", "))
		}
		if !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("bench: --policies: empty list")
	}
	return out, nil
}
