// Package routecheck judges every answer of a deployment with zero margin
// against the affinity log's history and what the serving edge had applied
// when it answered: the rule the chaos, soak, e2e and reliability suites
// share.
//
// An edge reports, in x-tether-route (debug_route_header), the request's id
// as the log's decisions record it and, per hop, the index of the replica
// state its decision read. An answer served on instance I for key K by edge
// E, with state index A, is right when
//
//  1. K was placed on I in the log at A (the placement in force: a created
//     Bind or a rebinding Overflow, until an eviction); or
//  2. the request itself committed it: an applied Overflow of this request
//     to I, appended before the answer ended (an edge commits every detour
//     before serving it), or this request's own Bind naming I (a new key
//     dispatched beside its proposal); or the log answered one of this
//     request's commits with a placement on I; or
//  3. K was unbound at A (or the log answered one of this request's commits
//     with K unbound) and I is where E's own Bind in flight at A proposed
//     it — the first Bind committed after A by E's process (SameProcess) —
//     or the placement the log answered that Bind with: an edge never
//     contradicts its own proposal.
//
// Anything else is wrong: in particular any answer on another instance than
// the placement in force at A (the latest at or below A) that is not a
// committed Overflow of its own request. An answer for a key unbound at A with no Bind of
// E after A and none of this request is unrecorded: its edge served a new
// placement whose proposal never reached the log (the edge died first);
// the suites excuse it only for an edge killed after the request began.
//
// A right answer may still be on another instance than the placement the
// log settled on, at the price of the key's cache (Divergence): a lost
// race (the edge served its own proposal for a key unbound at A, and a
// Bind appended after the request began won) or apply lag (the log had
// placed the key elsewhere before the request began, and the edge's state
// at A did not hold it yet). Verdict counts both apart, with the prompt
// tokens those answers prefilled away from the key's cache.
//
// A sub-agent's context hop routed by its parent's key is also judged
// against its own key (JudgeSubAgent): wrong if the state at A binds the
// sub-agent's own id (an edge routes it by that id then), apply lag if that
// binding was appended before the request began but is not at A.
//
// An edge older than the route evidence (no request id, no state index:
// the comparison runs against an earlier build) is judged by time with
// zero margin instead: A is the last entry appended before the request
// began, a detour is any applied Overflow to I appended while it ran, and
// a key unbound at A may be served where the first Bind after A, or a Bind
// of its edge, placed it.
package routecheck

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tether-project/tether/edge"
)

// Event is one entry of GET /admin/v1/bindings/{fleet}/{key}/history.
type Event struct {
	Index  uint64         `json:"index"`
	Time   time.Time      `json:"time"`
	Type   string         `json:"type"`
	Status string         `json:"status"`
	Event  map[string]any `json:"event"`
	// Decision is the placement decision a Bind or Overflow carries
	// (the event's "decision"); nil for other events.
	Decision *Decision `json:"-"`
	Evicted  *struct {
		Instance string `json:"instance"`
	} `json:"evicted"`
}

// Decision is who placed an event's key: the edge and the request id the
// edge's route evidence names.
type Decision struct {
	Edge      string `json:"edge"`
	RequestID string `json:"request_id"`
}

// UnmarshalJSON reads an entry and its event's decision.
func (ev *Event) UnmarshalJSON(b []byte) error {
	type plain Event
	if err := json.Unmarshal(b, (*plain)(ev)); err != nil {
		return err
	}
	var d struct {
		Event struct {
			Decision *Decision `json:"decision"`
		} `json:"event"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return err
	}
	ev.Decision = d.Event.Decision
	return nil
}

// History is a key's events as the admin API returns them, keeping only
// the events that place or remove the key (Placing): the others (Touch
// batches listing thousands of keys, Evidence, RankObserved) change no
// judgement, and a suite that caches every key's history would hold
// gigabytes of them (a long soak's key histories reached 5 MB each).
type History struct {
	Events        []Event `json:"events"`
	ArchiveBehind bool    `json:"archive_behind"`
}

// UnmarshalJSON reads a history and keeps its placing events, decoding
// only those in full.
func (h *History) UnmarshalJSON(b []byte) error {
	var raw struct {
		Events        []json.RawMessage `json:"events"`
		ArchiveBehind bool              `json:"archive_behind"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	h.ArchiveBehind, h.Events = raw.ArchiveBehind, nil
	for _, r := range raw.Events {
		var head struct {
			Type    string          `json:"type"`
			Evicted json.RawMessage `json:"evicted"`
		}
		if err := json.Unmarshal(r, &head); err != nil {
			return err
		}
		if head.Type != "Bind" && head.Type != "Overflow" && (len(head.Evicted) == 0 || string(head.Evicted) == "null") {
			continue
		}
		var ev Event
		if err := json.Unmarshal(r, &ev); err != nil {
			return err
		}
		h.Events = append(h.Events, ev)
	}
	return nil
}

// Placing returns the events of evs that place or remove a key: Binds,
// Overflows and evictions, in a slice of their own (evs's others, and
// their decoded events, are left to the garbage collector).
func Placing(evs []Event) []Event {
	var out []Event
	for _, ev := range evs {
		if ev.Type == "Bind" || ev.Type == "Overflow" || ev.Evicted != nil {
			out = append(out, ev)
		}
	}
	return out
}

// Route is what x-tether-route says about one answer.
type Route struct {
	Context, Generation           string // instances ("" or "-": no hop)
	RequestID                     string
	ContextState, GenerationState uint64
	HasState                      bool // the header carried state indexes
	// ContextOwn, GenerationOwn: a sub-agent's hop routed by its own
	// conversation id, not its parent's root.
	ContextOwn, GenerationOwn bool
}

// ParseRoute reads x-tether-route (edge.ParseRoute); a header it cannot
// read gives an empty Route.
func ParseRoute(h string) Route {
	r, _ := edge.ParseRoute(h)
	return Route{Context: r.ContextInstance, Generation: r.GenerationInstance, RequestID: r.RequestID,
		ContextState: r.ContextState, GenerationState: r.GenerationState, HasState: r.HasState,
		ContextOwn: r.ContextOwnKey, GenerationOwn: r.GenerationOwnKey}
}

// Answer is one hop of one answered request.
type Answer struct {
	Fleet, Key string
	Instance   string
	Edge       string // the serving edge's node id (Decision.Edge; EdgeOfRequest)
	RequestID  string
	State      uint64
	Start, End time.Time
	// PromptTokens is the answer's prompt as its usage counts it: what it
	// prefilled away from its key's cache when it diverged (Divergence).
	PromptTokens int
}

// Kind is how an answer was judged.
type Kind int

const (
	// OnBinding: the placement in force at the decision's state, or the
	// one the log answered this request's commits with.
	OnBinding Kind = iota + 1
	// Detoured: a committed Overflow of this request.
	Detoured
	// NewPlacement: this request's own Bind, or its edge's own proposal in
	// flight (or the log's answer to it) for a key unbound at its state.
	NewPlacement
	// Unrecorded: a key unbound at its state, served without any Bind of
	// its edge or request in the log.
	Unrecorded
	// Wrong: none of the above.
	Wrong
)

func (k Kind) String() string {
	switch k {
	case OnBinding:
		return "on_binding"
	case Detoured:
		return "detoured"
	case NewPlacement:
		return "new_placement"
	case Unrecorded:
		return "unrecorded"
	case Wrong:
		return "wrong"
	}
	return "kind(?)"
}

// change is the placement in force from index on ("" = unbound).
type change struct {
	index    uint64
	instance string
}

// timeline rebuilds a key's placements from its history: a Bind that
// created the binding, a rebinding Overflow that moved it, an eviction.
func timeline(evs []Event) []change {
	var out []change
	cur := ""
	set := func(idx uint64, inst string) {
		cur = inst
		if n := len(out); n > 0 && out[n-1].index == idx {
			out[n-1].instance = inst
			return
		}
		out = append(out, change{index: idx, instance: inst})
	}
	for _, ev := range evs {
		if ev.Evicted != nil && cur != "" {
			set(ev.Index, "")
		}
		switch {
		case ev.Type == "Bind" && ev.Status == "applied" && cur == "":
			inst, _ := ev.Event["instance"].(string)
			set(ev.Index, inst)
		case ev.Type == "Overflow" && ev.Status == "applied" && ev.Event["rebind"] == true && cur != "":
			to, _ := ev.Event["to"].(string)
			set(ev.Index, to)
		}
	}
	return out
}

// at is the placement in force after index.
func at(tl []change, index uint64) string {
	inst := ""
	for _, c := range tl {
		if c.index > index {
			break
		}
		inst = c.instance
	}
	return inst
}

// Judge judges one answer against its key's history.
func Judge(a Answer, evs []Event) (Kind, string) {
	k, why, _ := judge(a, evs)
	return k, why
}

// judge is Judge, with the index of the Bind a NewPlacement answer followed
// (this request's own, or its edge's in flight).
func judge(a Answer, evs []Event) (Kind, string, uint64) {
	if a.RequestID == "" {
		k, why := judgeByTime(a, evs)
		return k, why, 0
	}
	tl := timeline(evs)
	inForce := at(tl, a.State)
	if inForce != "" && a.Instance == inForce {
		return OnBinding, "", 0
	}
	unbound := inForce == ""
	mine := func(ev Event) bool {
		return ev.Decision != nil && ev.Decision.RequestID == a.RequestID && ev.Decision.Edge == a.Edge
	}
	for _, ev := range evs {
		if !mine(ev) {
			continue
		}
		switch {
		case ev.Type == "Overflow" && ev.Status == "applied" && ev.Event["to"] == a.Instance && !ev.Time.After(a.End):
			return Detoured, "", 0
		case ev.Type == "Bind" && ev.Event["instance"] == a.Instance && inForce == "":
			// A new placement only for a key the edge's state did not
			// bind: a bound key leaves its placement only by an Overflow.
			return NewPlacement, "", ev.Index
		}
		if ev.Type == "Bind" || ev.Type == "Overflow" {
			ans := at(tl, ev.Index)
			if ans == a.Instance {
				return OnBinding, "", 0
			}
			unbound = unbound || ans == ""
		}
	}
	ownSeen := false
	if unbound {
		for _, ev := range evs {
			if ev.Type != "Bind" || ev.Index <= a.State || ev.Decision == nil || ev.Decision.Edge != a.Edge ||
				!SameProcess(ev.Decision.RequestID, a.RequestID) {
				continue
			}
			ownSeen = true
			if ev.Event["instance"] == a.Instance || at(tl, ev.Index) == a.Instance {
				return NewPlacement, "", ev.Index
			}
			break // only the first: the one in flight at the decision
		}
		if !ownSeen {
			return Unrecorded, fmt.Sprintf("%s key %q unbound at state %d, served on %s by %s (request %s) with no Bind of that edge after it",
				a.Fleet, a.Key, a.State, a.Instance, a.Edge, a.RequestID), 0
		}
	}
	return Wrong, fmt.Sprintf("%s key %q placed on %q at state %d, served on %s by %s (request %s, ended %s)",
		a.Fleet, a.Key, inForce, a.State, a.Instance, a.Edge, a.RequestID, a.End.Format(time.RFC3339Nano)), 0
}

// Divergence is why a right answer (OnBinding or NewPlacement) was served
// elsewhere than the key's placement in the log: what it cost is the
// cache of its prompt.
type Divergence int

const (
	// Converged: on the placement the log settled on (or a detour the
	// request committed).
	Converged Divergence = iota
	// LostRace: on its edge's own proposal for a key unbound in the state
	// the decision read, and another edge's Bind, appended after the
	// request began, won: proposals racing each other.
	LostRace
	// ApplyLag: the log had placed the key on another instance before the
	// request began (appended before its start), and the state the
	// decision read did not hold that placement yet.
	ApplyLag
)

func (d Divergence) String() string {
	switch d {
	case Converged:
		return "converged"
	case LostRace:
		return "lost_race"
	case ApplyLag:
		return "apply_lag"
	}
	return "divergence(?)"
}

// Diverged classifies a right answer by where the log placed its key:
// apply lag when the placement in force when the request began (by the
// log's append times) is another instance, else a lost race when the Bind
// a new placement followed (bind, its index) was settled on another
// instance. Detours, unrecorded and wrong answers are Converged here:
// Verdict counts them apart.
func Diverged(a Answer, evs []Event, k Kind, bind uint64) Divergence {
	if k != OnBinding && k != NewPlacement {
		return Converged
	}
	tl := timeline(evs)
	before := appendedBefore(evs, a.Start)
	if inst := at(tl, before); before > 0 && inst != "" && inst != a.Instance {
		return ApplyLag
	}
	if k == NewPlacement && bind > 0 {
		if won := at(tl, bind); won != "" && won != a.Instance {
			return LostRace
		}
	}
	return Converged
}

// appendedBefore is the index of the last of evs appended before t (0:
// none).
func appendedBefore(evs []Event, t time.Time) uint64 {
	var before uint64
	for _, ev := range evs {
		if ev.Time.Before(t) {
			before = ev.Index
		}
	}
	return before
}

// judgeByTime judges an answer that carries no route evidence.
func judgeByTime(a Answer, evs []Event) (Kind, string) {
	tl := timeline(evs)
	var state uint64
	for _, ev := range evs {
		if ev.Time.Before(a.Start) {
			state = ev.Index
		}
	}
	inForce := at(tl, state)
	if inForce != "" && a.Instance == inForce {
		return OnBinding, ""
	}
	for _, ev := range evs {
		if ev.Type == "Overflow" && ev.Status == "applied" && ev.Event["to"] == a.Instance && !ev.Time.Before(a.Start) && !ev.Time.After(a.End) {
			return Detoured, ""
		}
	}
	if inForce == "" {
		first := true
		for _, ev := range evs {
			if ev.Type != "Bind" || ev.Index <= state {
				continue
			}
			if ev.Event["instance"] == a.Instance && (first || (ev.Decision != nil && ev.Decision.Edge == a.Edge)) {
				return NewPlacement, ""
			}
			first = false
		}
	}
	return Wrong, fmt.Sprintf("%s key %q placed on %q when the request began (%s), served on %s by %s, ended %s",
		a.Fleet, a.Key, inForce, a.Start.Format(time.RFC3339Nano), a.Instance, a.Edge, a.End.Format(time.RFC3339Nano))
}

// Placement is how an acknowledged key's history accounts for the key.
type Placement int

const (
	// Placed: a Bind of the key committed (it created the binding, or
	// lost to the binding in force).
	Placed Placement = iota + 1
	// PlacedThenLeft: placed, and since evicted (its history says why).
	PlacedThenLeft
	// ServedUnbound: no Bind of the key committed, and every answer of it
	// was served on a new placement whose Bind never reached the log, by
	// an edge killed with that Bind in flight (Unrecorded, excused). Soft
	// affinity allows it: the key's next request is placed anew (or
	// follows the placement another edge heard) and proposed by a live
	// edge; no such request came.
	ServedUnbound
	// Lost: no Bind of the key committed, although some answer of it was
	// served on a placement the log should hold.
	Lost
)

func (p Placement) String() string {
	switch p {
	case Placed:
		return "placed"
	case PlacedThenLeft:
		return "placed_then_left"
	case ServedUnbound:
		return "served_unbound"
	case Lost:
		return "lost"
	}
	return "placement(?)"
}

// AckedPlacement judges an acknowledged key by its history (the context
// fleet's, for a conversation's root). unrecordedOnly reports that the key
// had answers and every one was judged Unrecorded and excused (Judge,
// Verdict.Add): only then is a key with no committed Bind ServedUnbound
// rather than Lost.
func AckedPlacement(evs []Event, unrecordedOnly bool) Placement {
	bound, left := false, false
	for _, ev := range evs {
		if ev.Type == "Bind" && (ev.Status == "applied" || ev.Status == "superseded") {
			bound = true
		}
		if ev.Evicted != nil {
			left = true
		}
	}
	switch {
	case !bound && unrecordedOnly:
		return ServedUnbound
	case !bound:
		return Lost
	case left:
		return PlacedThenLeft
	}
	return Placed
}

// Verdict counts a suite's answers by kind, and the right ones that
// diverged from their key's placement in the log by cause, with the prompt
// tokens they prefilled away from the key's cache.
type Verdict struct {
	Judged                                        int
	OnBinding, Detoured, NewPlacement, Unrecorded int
	Wrong                                         int
	Reports                                       []string // the first few wrong and unrecorded answers
	LostRace, ApplyLag                            int
	LostRacePrefill, ApplyLagPrefill              int64 // prompt tokens of those answers
}

// Judge judges a against its key's history, counts it (Add) and, when it
// is right but diverged from the log's placement, counts the divergence
// and its prefill.
func (v *Verdict) Judge(a Answer, evs []Event, excused bool) (Kind, string) {
	k, why, bind := judge(a, evs)
	v.Add(k, why, excused)
	v.diverged(a, Diverged(a, evs, k, bind))
	return k, why
}

// JudgeSubAgent judges a, a sub-agent's context hop routed by its parent's
// key a.Key, against that key's history (Judge) and the placing events of
// the sub-agent's own key ownKey (own). An edge routes a sub-agent by its
// own id once the state its decision read binds that id (the sub-agent
// left its parent's instance), so a hop by the parent's key at a state
// where the own binding is in force is wrong, wherever it went. A right
// hop whose own binding was appended before the request began, but is not
// in the state the decision read, diverged by apply lag.
func (v *Verdict) JudgeSubAgent(a Answer, ownKey string, root, own []Event, excused bool) (Kind, string) {
	otl := timeline(own)
	if inst := at(otl, a.State); inst != "" {
		why := fmt.Sprintf("sub-agent %q served on %s by %s (request %s) by its parent's key %q at state %d, where its own binding on %s was in force",
			ownKey, a.Instance, a.Edge, a.RequestID, a.Key, a.State, inst)
		v.Add(Wrong, why, false)
		return Wrong, why
	}
	k, why, bind := judge(a, root)
	v.Add(k, why, excused)
	d := Diverged(a, root, k, bind)
	if before := appendedBefore(own, a.Start); d == Converged && (k == OnBinding || k == NewPlacement) && at(otl, before) != "" {
		d = ApplyLag
	}
	v.diverged(a, d)
	return k, why
}

// diverged counts a right answer's divergence and its prefill.
func (v *Verdict) diverged(a Answer, d Divergence) {
	switch d {
	case LostRace:
		v.LostRace++
		v.LostRacePrefill += int64(a.PromptTokens)
	case ApplyLag:
		v.ApplyLag++
		v.ApplyLagPrefill += int64(a.PromptTokens)
	}
}

// Merge adds o's counts to v (its reports while v holds fewer than 8).
func (v *Verdict) Merge(o Verdict) {
	v.Judged += o.Judged
	v.OnBinding += o.OnBinding
	v.Detoured += o.Detoured
	v.NewPlacement += o.NewPlacement
	v.Unrecorded += o.Unrecorded
	v.Wrong += o.Wrong
	v.LostRace += o.LostRace
	v.ApplyLag += o.ApplyLag
	v.LostRacePrefill += o.LostRacePrefill
	v.ApplyLagPrefill += o.ApplyLagPrefill
	for _, r := range o.Reports {
		if len(v.Reports) < 8 {
			v.Reports = append(v.Reports, r)
		}
	}
}

// Add counts one judged answer; excuse reports whether an unrecorded one
// is excused (its edge was killed after the request began).
func (v *Verdict) Add(k Kind, why string, excused bool) {
	v.Judged++
	switch k {
	case OnBinding:
		v.OnBinding++
		return
	case Detoured:
		v.Detoured++
		return
	case NewPlacement:
		v.NewPlacement++
		return
	case Unrecorded:
		if excused {
			v.Unrecorded++
			return
		}
	}
	v.Wrong++
	if len(v.Reports) < 8 {
		v.Reports = append(v.Reports, why)
	}
}

// SameProcess reports whether two request ids were made by one edge
// process: an edge numbers its requests from a random point chosen at
// start (the high 31 bits of "<node id>-<n>"), so a restarted edge's ids
// differ from its previous process's.
func SameProcess(a, b string) bool {
	na, sa, ok1 := splitRequest(a)
	nb, sb, ok2 := splitRequest(b)
	return ok1 && ok2 && na == nb && sa>>32 == sb>>32
}

func splitRequest(id string) (string, uint64, bool) {
	i := strings.LastIndexByte(id, '-')
	if i <= 0 {
		return "", 0, false
	}
	n, err := strconv.ParseUint(id[i+1:], 10, 64)
	return id[:i], n, err == nil
}

// EdgeOfRequest is the node id of the edge that made a request id
// ("<node id>-<sequence>").
func EdgeOfRequest(id string) string {
	if i := strings.LastIndexByte(id, '-'); i > 0 {
		return id[:i]
	}
	return ""
}

func (v Verdict) String() string {
	return fmt.Sprintf("judged=%d on_binding=%d detoured=%d new_placement=%d unrecorded_after_kill=%d wrong=%d lost_races=%d (prefill %d tokens) apply_lag=%d (prefill %d tokens)",
		v.Judged, v.OnBinding, v.Detoured, v.NewPlacement, v.Unrecorded, v.Wrong, v.LostRace, v.LostRacePrefill, v.ApplyLag, v.ApplyLagPrefill)
}
