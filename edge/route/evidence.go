package route

import (
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing"
)

// observeRouted counts a placed hop of rq on fleet f.
func (e *Router) observeRouted(rq *Request, f fsm.Fleet, h *Hop) {
	kind := "conversation"
	if rq.ID.SubAgent() {
		kind = "subagent"
	}
	e.metrics.Routed.Requests.WithLabelValues(f.String(), h.Instance, kind).Inc()
	if prefill := rq.Prompts[f].Tokens - h.Cached; prefill > 0 {
		e.metrics.Routed.Prefill.WithLabelValues(f.String(), h.Instance).Add(float64(prefill))
	}
}

// recordEvidence records, in the background (the recorder's bounded queue:
// never on the request's path), what the edge saw when it placed h: the rule
// and each candidate the decision kept (at most fsm.MaxCandidates, the
// chosen one first) with its cached blocks, load and state. Only placements
// that the log records (new binds, overflows, degraded binds) get evidence;
// sticky turns are touches and cost nothing more.
func (e *Router) recordEvidence(rq *Request, f fsm.Fleet, h *Hop) {
	var rule, bound string
	switch {
	case h.Policy == routing.PolicyPending:
		return // served on an earlier request's placement: no new decision
	case h.Outcome == outcomeNewBind || h.Outcome == outcomeDegraded:
		rule = h.Policy
	case h.Outcome == outcomeOverflow:
		// The instance the key left (a rebind's binding is already the
		// new one).
		rule, bound = "overflow:"+h.Reason.String(), h.From
	default:
		return
	}
	// The views the decision read (cached by views(); read here without
	// rebuilding them, which would feed the overload tracker again).
	var views []routing.InstanceView
	if c := rq.Model.Views.Load(); c != nil {
		views = c.Views.Fleet(f)
	}
	ev := evidenceOf(f, h.Key, rq.RequestID, rule, h.Instance, bound, h.Binding.Decision.Candidates,
		views, rq.Model.Tokenizers[f].BlockSize())
	if e.placements.HoldEvidence(ev) {
		return // proposed once the placement's Bind is answered
	}
	e.recorder.Add(ev, nil)
}

// evidenceOf builds a placement's Evidence from the decision's candidates
// and the instance views the decision was made from: chosen first, then the
// key's binding it left (bound, for an overflow), then the other candidates.
func evidenceOf(f fsm.Fleet, key, requestID, rule, chosen, bound string, cands []fsm.Candidate, views []routing.InstanceView, blockSize int) fsm.Evidence {
	ev := fsm.Evidence{Fleet: f, Key: key, RequestID: requestID, Rule: rule}
	add := func(c fsm.Candidate) {
		ec := fsm.EvidenceCandidate{Instance: c.Instance, LoadTokens: c.LoadTokens}
		if blockSize > 0 {
			ec.CachedBlocks = c.CachedTokens / uint32(blockSize)
		}
		if c.Instance == chosen {
			ec.Flags |= fsm.EvidenceChosen
		}
		if c.Instance == bound {
			ec.Flags |= fsm.EvidenceBound
		}
		for i := range views {
			v := &views[i]
			if v.ID != c.Instance {
				continue
			}
			ec.QueuedRequests = uint32(max(0, v.QueuedRequests))
			if v.CacheDegraded {
				ec.Flags |= fsm.EvidenceBreakerOpen
			}
			if !v.Healthy {
				ec.Flags |= fsm.EvidenceUnhealthy
			}
			if v.Draining {
				ec.Flags |= fsm.EvidenceDraining
			}
		}
		ev.Candidates = append(ev.Candidates, ec)
	}
	first := func(id string) {
		if id == "" {
			return
		}
		for _, c := range cands {
			if c.Instance == id {
				add(c)
				return
			}
		}
		add(fsm.Candidate{Instance: id})
	}
	first(chosen)
	if bound != chosen {
		first(bound)
	}
	for _, c := range cands {
		if c.Instance != chosen && c.Instance != bound && len(ev.Candidates) < fsm.MaxCandidates {
			add(c)
		}
	}
	return ev
}
