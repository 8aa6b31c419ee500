package audit

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
)

// ExplainOptions select what Explain reports.
type ExplainOptions struct {
	// Fleets to explain the key in (default: context and generation).
	Fleets []fsm.Fleet
	// NoChildren skips the search for sub-agents linked to the key (the
	// one part of explain that reads beyond the key's own records).
	NoChildren bool
	// Model names a model other than the edge's first, whose keys are in
	// its namespace (fsm.ModelKey); "" for the first model's bare keys.
	// Links are the conversations' own, shared by all models.
	Model string
}

// Explanation is the history of one routing key.
type Explanation struct {
	Key string `json:"key"`
	// Model is ExplainOptions.Model: the histories are of its keys.
	Model     string       `json:"model,omitempty"`
	Histories []KeyHistory `json:"histories"`
	// Children are the sub-agents whose parent links resolve to Key as
	// their root (Link events with Root == Key), with their own histories.
	Children []Child `json:"children"`
	// ChildSearch says how the children were found.
	ChildSearch string `json:"child_search,omitempty"`
	// Notes: trimmed history and other limits of what the archive holds.
	Notes []string `json:"notes,omitempty"`
}

// Found reports whether the data directory holds anything about the key:
// a step of its history in some fleet, or a sub-agent linked to it.
func (ex *Explanation) Found() bool {
	if len(ex.Children) > 0 {
		return true
	}
	for _, h := range ex.Histories {
		if len(h.Items) > 0 {
			return true
		}
	}
	return false
}

// KeyHistory is a key's history in one fleet.
type KeyHistory struct {
	Fleet string `json:"fleet"`
	Key   string `json:"key"`
	Items []Item `json:"items"`
	// Final is the binding in force after the last item as the history
	// reconstructs it ("" when unbound; "unknown" when history before the
	// archive's horizon is missing and nothing since decided it).
	Final string `json:"final"`
}

// Item is one step of a key's history: a bind, a window of touches, an
// overflow, an eviction (by an Evict event or as an effect of another
// event), or a parent link.
type Item struct {
	Kind  string    `json:"kind"` // bind | touches | overflow | evict | evicted | rank
	Index uint64    `json:"index"`
	Time  time.Time `json:"time"`
	// LastIndex, LastTime and Count describe a touch window.
	LastIndex uint64    `json:"last_index,omitempty"`
	LastTime  time.Time `json:"last_time,omitzero"`
	Count     int       `json:"count,omitempty"`
	// Status and StatusReason are the apply outcome the archive recorded.
	Status         string            `json:"status"`
	StatusReason   string            `json:"status_reason,omitempty"`
	Instance       string            `json:"instance,omitempty"`
	ConversationID string            `json:"conversation_id,omitempty"`
	From           string            `json:"from,omitempty"`
	To             string            `json:"to,omitempty"`
	Rebind         bool              `json:"rebind,omitempty"`
	Reason         string            `json:"reason,omitempty"` // overflow or eviction reason
	Epoch          uint64            `json:"epoch,omitempty"`
	Rank           *uint32           `json:"rank,omitempty"` // a RankObserved step's rank
	Detail         string            `json:"detail,omitempty"`
	Decision       *fsm.DecisionJSON `json:"decision,omitempty"`
	// Evidence is what the deciding edge saw (an Evidence event of the same
	// request, recorded after the placement).
	Evidence *fsm.EvidenceJSON `json:"evidence,omitempty"`
	// Outcome says in words what the step did to the binding.
	Outcome string `json:"outcome"`
}

// Child is a sub-agent linked to the explained key.
type Child struct {
	Child     string       `json:"child"`
	Parent    string       `json:"parent"`
	Depth     uint8        `json:"depth"`
	Index     uint64       `json:"link_index"`
	Time      time.Time    `json:"link_time"`
	Status    string       `json:"link_status"`
	Reason    string       `json:"link_status_reason,omitempty"`
	Histories []KeyHistory `json:"histories"`
}

// Explain reports the full history of key: per fleet, every bind, touch
// window, overflow, rank observation and eviction (including evictions that
// were effects of other events: capacity, instance down) with index, log
// time, deciding edge, policy and the recorded candidates; and the
// sub-agents linked to it as their root. The key's own records come from
// the archive's per-key index, the children from its links index (with a
// scan of what an older archive wrote before that index existed; see
// DESIGN.md).
func (d *DataDir) Explain(ctx context.Context, key string, opts ExplainOptions) (*Explanation, error) {
	if key == "" {
		return nil, fmt.Errorf("audit: explain: empty key")
	}
	fleets := opts.Fleets
	if len(fleets) == 0 {
		fleets = []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration}
	}
	b, err := d.Bounds()
	if err != nil {
		return nil, err
	}
	complete := b.TrimmedTo == 0 && len(b.Restores) == 0
	ex := &Explanation{Key: key, Model: opts.Model, Histories: []KeyHistory{}, Children: []Child{}}
	if !complete {
		ex.Notes = append(ex.Notes, horizonNote(b))
	}
	for _, f := range fleets {
		k := fsm.ModelKey(opts.Model, key)
		recs, err := d.archive.History(f, k)
		if err != nil {
			return nil, fmt.Errorf("audit: explain: %w", err)
		}
		ex.Histories = append(ex.Histories, buildHistory(f, k, recs, complete))
	}
	if opts.NoChildren {
		return ex, nil
	}
	links, scanned, err := d.linksTo(ctx, key)
	if err != nil {
		return nil, err
	}
	ex.ChildSearch = fmt.Sprintf("Link events with root %q: %s", key, scanned)
	for _, l := range links {
		c := Child{Child: l.link.Child, Parent: l.link.Parent, Depth: l.link.Depth, Index: l.index, Time: logTime(l.time),
			Status: l.status, Reason: l.reason, Histories: []KeyHistory{}}
		for _, f := range fleets {
			k := fsm.ModelKey(opts.Model, l.link.Child)
			recs, err := d.archive.History(f, k)
			if err != nil {
				return nil, fmt.Errorf("audit: explain child %q: %w", l.link.Child, err)
			}
			if len(recs) > 0 {
				c.Histories = append(c.Histories, buildHistory(f, k, recs, complete))
			}
		}
		ex.Children = append(ex.Children, c)
	}
	return ex, nil
}

func horizonNote(b Bounds) string {
	var parts []string
	if b.TrimmedTo != 0 {
		parts = append(parts, fmt.Sprintf("retention trimmed indexes %d..%d", b.TrimmedFrom, b.TrimmedTo))
	}
	if len(b.Restores) > 0 {
		parts = append(parts, fmt.Sprintf("the node restored snapshots at state indexes %v (entries before them may be missing)", b.Restores))
	}
	return "history is incomplete: " + strings.Join(parts, "; ")
}

// binding is explain's reconstruction of a key's binding.
type binding struct {
	known    bool // false: history before the horizon may have bound it
	bound    bool
	instance string
	epoch    uint64
	rank     *uint32 // the worker-reported rank of the placement, when observed
}

func (b binding) String() string {
	switch {
	case b.bound && b.rank != nil:
		return fmt.Sprintf("bound to %s rank %d (epoch %d)", b.instance, *b.rank, b.epoch)
	case b.bound:
		return fmt.Sprintf("bound to %s (epoch %d)", b.instance, b.epoch)
	case !b.known:
		return "unknown"
	}
	return ""
}

// buildHistory turns a key's archive records into items.
func buildHistory(f fsm.Fleet, key string, recs []archive.Record, complete bool) KeyHistory {
	hb := historyBuilder{h: KeyHistory{Fleet: f.String(), Key: key, Items: []Item{}}, cur: binding{known: complete}}
	for _, ke := range archive.KeyEvents(recs, f, key) {
		hb.add(ke)
	}
	hb.flushTouch()
	hb.h.Final = hb.cur.String()
	return hb.h
}

// historyBuilder narrates a key's events: what each did to the binding as
// explain reconstructs it, consecutive touches folded into one window.
type historyBuilder struct {
	h     KeyHistory
	cur   binding
	touch *Item // the open touch window
}

func (hb *historyBuilder) flushTouch() {
	if hb.touch != nil {
		hb.h.Items = append(hb.h.Items, *hb.touch)
		hb.touch = nil
	}
}

func (hb *historyBuilder) add(ke archive.KeyEvent) {
	if ke.Err != nil {
		hb.flushTouch()
		hb.h.Items = append(hb.h.Items, Item{Kind: "undecodable", Index: ke.Index, Time: logTime(ke.Time), Status: "unknown", Outcome: ke.Err.Error()})
		return
	}
	out := ke.Outcome
	it := Item{Index: ke.Index, Time: logTime(ke.Time), Status: out.Status.String(), StatusReason: out.Reason}
	if out.Status == 0 {
		it.Status = "not recorded"
	}
	evicted := ke.Evicted
	if ke.Names {
		if _, isTouch := ke.Proposal.Event.(fsm.Touch); isTouch {
			hb.touched(it)
		} else if hb.narrate(ke, &it) {
			hb.flushTouch()
			hb.h.Items = append(hb.h.Items, it)
			if _, isEvict := ke.Proposal.Event.(fsm.Evict); isEvict {
				evicted = nil // reported by the Evict item, not again as an effect
			}
		}
	}
	if evicted == nil {
		return
	}
	// The key left the state as an effect of this proposal (a capacity
	// eviction, an instance going down).
	hb.flushTouch()
	it = Item{Index: ke.Index, Time: it.Time, Status: it.Status, StatusReason: it.StatusReason,
		Kind: "evicted", Instance: evicted.Instance, Epoch: evicted.Epoch, Reason: evicted.Reason.String()}
	it.Outcome = fmt.Sprintf("evicted from %s (epoch %d) by %s", evicted.Instance, evicted.Epoch, effectCause(ke.Proposal, evicted.Reason))
	hb.cur = binding{known: true}
	hb.h.Items = append(hb.h.Items, it)
}

func (hb *historyBuilder) touched(it Item) {
	if hb.touch == nil {
		hb.touch = &Item{Kind: "touches", Index: it.Index, Time: it.Time, Status: it.Status, Outcome: "last use recorded"}
	}
	hb.touch.LastIndex, hb.touch.LastTime = it.Index, it.Time
	hb.touch.Count++
}

// narrate fills it for an event that names the key (other than Touch) and
// reports whether it is an item of the history.
func (hb *historyBuilder) narrate(ke archive.KeyEvent, it *Item) bool {
	out := ke.Outcome
	switch e := ke.Proposal.Event.(type) {
	case fsm.Bind:
		d := fsm.DescribeDecision(e.Decision)
		it.Kind, it.Instance, it.ConversationID, it.Decision = "bind", e.Instance, e.ConversationID, &d
		it.Outcome = hb.cur.bind(out.Status, out.Reason, e.Instance, outcomeEpoch(out, ke.Index))
		if out.Status == fsm.StatusApplied {
			it.Epoch = hb.cur.epoch
		}
	case fsm.Overflow:
		d := fsm.DescribeDecision(e.Decision)
		it.Kind, it.From, it.To, it.Rebind, it.Reason, it.Decision = "overflow", e.From, e.To, e.Rebind, e.Reason.String(), &d
		it.Outcome = hb.cur.overflow(&e, out.Status, out.Reason, outcomeEpoch(out, ke.Index))
	case fsm.Evidence:
		ej := fsm.DescribeEvidence(e)
		if prev := placementOf(hb.h.Items, e.RequestID); prev != nil {
			prev.Evidence = &ej // told with its placement, not as an item
			return false
		}
		it.Kind, it.Evidence, it.Outcome = "evidence", &ej, "evidence of a placement not in this history"
	case fsm.RankObserved:
		rank := e.Rank
		it.Kind, it.Epoch, it.Rank = "rank", e.Epoch, &rank
		it.Outcome = hb.cur.observeRank(&e, out.Status, out.Reason)
	case fsm.Evict:
		it.Kind, it.Reason, it.Epoch, it.Detail = "evict", e.Reason.String(), e.Epoch, e.Detail
		if ev := ke.Evicted; ev != nil {
			it.Instance = ev.Instance
			it.Outcome = fmt.Sprintf("evicted from %s (epoch %d, %s)", ev.Instance, ev.Epoch, ev.Reason)
			hb.cur = binding{known: true}
		} else {
			it.Outcome = "not evicted"
			if out.Reason != "" {
				it.Outcome += ": " + out.Reason
			}
		}
	default:
		return false
	}
	return true
}

// placementOf is the latest bind or overflow of items decided for
// requestID (nil if none).
func placementOf(items []Item, requestID string) *Item {
	if requestID == "" {
		return nil
	}
	for i := len(items) - 1; i >= 0; i-- {
		it := &items[i]
		if (it.Kind == "bind" || it.Kind == "overflow") && it.Decision != nil && it.Decision.RequestID == requestID {
			return it
		}
	}
	return nil
}

func (b *binding) bind(s fsm.Status, reason, instance string, index uint64) string {
	switch s {
	case fsm.StatusSuperseded:
		if b.bound {
			return fmt.Sprintf("superseded: already bound to %s (epoch %d); the first committed binding wins", b.instance, b.epoch)
		}
		return "superseded: the key was already bound; the first committed binding wins"
	case fsm.StatusApplied:
		if b.bound {
			return fmt.Sprintf("no-op: already bound to %s (epoch %d); the first committed binding wins", b.instance, b.epoch)
		}
		if !b.known {
			*b = binding{known: true, bound: true, instance: instance, epoch: index}
			return fmt.Sprintf("bound to %s (epoch %d), unless bound before the archive's horizon", instance, index)
		}
		*b = binding{known: true, bound: true, instance: instance, epoch: index}
		return fmt.Sprintf("bound to %s (epoch %d)", instance, index)
	case fsm.StatusDuplicate:
		return "duplicate proposal (a retry of one already applied): nothing changed"
	case fsm.StatusRejected:
		return "rejected: " + reason
	}
	return s.String()
}

// outcomeEpoch is the epoch of the placement an applied Bind or rebinding
// Overflow left in force: the archive records it (format 2); older records
// do not, and were written when an epoch was its entry's index.
func outcomeEpoch(o archive.Outcome, index uint64) uint64 {
	if o.Epoch != 0 {
		return o.Epoch
	}
	return index
}

func (b *binding) observeRank(e *fsm.RankObserved, s fsm.Status, reason string) string {
	switch s {
	case fsm.StatusApplied:
		rank := e.Rank
		if b.bound && b.epoch == e.Epoch {
			b.rank = &rank
			return fmt.Sprintf("rank %d on %s (epoch %d)", e.Rank, b.instance, e.Epoch)
		}
		return fmt.Sprintf("rank %d for the placement with epoch %d", e.Rank, e.Epoch)
	case fsm.StatusConditionFailed:
		return "not recorded: " + reason
	case fsm.StatusRejected:
		return "rejected: " + reason
	}
	return s.String()
}

func (b *binding) overflow(e *fsm.Overflow, s fsm.Status, reason string, index uint64) string {
	switch {
	case s == fsm.StatusApplied && e.Rebind:
		*b = binding{known: true, bound: true, instance: e.To, epoch: index}
		if e.Reason == fsm.OverflowDrained {
			return fmt.Sprintf("moved from %s to %s (epoch %d): an operator drained %s (tether operator instance drain), so the key left it on this turn", e.From, e.To, index, e.From)
		}
		return fmt.Sprintf("moved from %s to %s (epoch %d)", e.From, e.To, index)
	case s == fsm.StatusApplied:
		return fmt.Sprintf("served by %s; the binding stays on %s", e.To, e.From)
	case s == fsm.StatusConditionFailed:
		return "not moved: " + reason
	case s == fsm.StatusRejected:
		return "rejected: " + reason
	}
	return s.String()
}

// effectCause describes the event whose apply evicted a binding it did not
// name.
func effectCause(p fsm.RawProposal, r fsm.EvictReason) string {
	switch e := p.Event.(type) {
	case fsm.InstanceState:
		return fmt.Sprintf("InstanceState: instance %s %s", e.Instance, e.Status)
	case nil:
		return fmt.Sprintf("%s (%s)", p.Type, r)
	}
	if r == fsm.EvictCapacity {
		keys := fsm.EventKeys(p.Event)
		what := p.Type.String()
		if len(keys) > 0 {
			what = fmt.Sprintf("%s of %s/%q", p.Type, keys[0].Fleet, keys[0].Key)
		}
		return fmt.Sprintf("capacity: the state exceeded max_bindings when a %s applied (least recently used binding evicted)", what)
	}
	return fmt.Sprintf("%s (%s)", p.Type, r)
}

type linkHit struct {
	link   fsm.Link
	index  uint64
	time   int64
	status string
	reason string
}

// linksTo finds the Link events whose root is key: from the archive's
// links index, and by reading the records an archive wrote before that
// index existed (a byte search for the key skips the envelope walk of
// records that cannot hold one). It says in words what it did.
func (d *DataDir) linksTo(ctx context.Context, root string) ([]linkHit, string, error) {
	var out []linkHit
	seen := map[string]bool{}
	collect := func(r archive.Record) {
		for _, l := range findLinks(r.Data) {
			if l.link.Root != root || seen[l.link.Child] {
				continue
			}
			seen[l.link.Child] = true
			l.index, l.time = r.Index, r.Time
			if l.pos < len(r.Outcomes) {
				o := r.Outcomes[l.pos]
				l.status, l.reason = o.Status.String(), o.Reason
			}
			out = append(out, l.linkHit)
		}
	}
	from, indexed, err := d.archive.LinkIndexFrom()
	if err != nil {
		return nil, "", fmt.Errorf("audit: explain: %w", err)
	}
	scanned := 0
	if !indexed || from > 1 {
		// Records written before the links index: read them.
		needle := []byte(root)
		var to uint64
		if indexed {
			to = from - 1
		}
		err = d.archive.Range(0, to, func(r archive.Record) error {
			scanned++
			if scanned%4096 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			if bytes.Contains(r.Data, needle) {
				collect(r)
			}
			return nil
		})
		if err != nil {
			return nil, "", fmt.Errorf("audit: explain: search Link events: %w", err)
		}
	}
	how := fmt.Sprintf("%d archive records scanned (the archive has no links index)", scanned)
	if indexed {
		recs, err := d.archive.Links(root)
		if err != nil {
			return nil, "", fmt.Errorf("audit: explain: %w", err)
		}
		for _, r := range recs {
			collect(r)
		}
		how = fmt.Sprintf("%d records from the archive's links index", len(recs))
		if scanned > 0 {
			how += fmt.Sprintf(", %d older records (before the index, below %d) scanned", scanned, from)
		}
	}
	return out, how, nil
}

type positionedLink struct {
	linkHit
	pos int
}

// findLinks walks an entry's envelope (version, count, then id | length |
// event per proposal) and decodes only the Link events.
func findLinks(data []byte) []positionedLink {
	if len(data) == 0 || data[0] != 1 {
		return nil
	}
	off := 1
	n, k := binary.Uvarint(data[off:])
	if k <= 0 {
		return nil
	}
	off += k
	var out []positionedLink
	for i := uint64(0); i < n; i++ {
		if len(data)-off < 16 {
			return out
		}
		off += 16
		size, k := binary.Uvarint(data[off:])
		if k <= 0 || size == 0 || size > uint64(len(data)-off-k) {
			return out
		}
		off += k
		ev := data[off : off+int(size)]
		off += int(size)
		if fsm.EventType(ev[0]) != fsm.TypeLink {
			continue
		}
		one := make([]byte, 0, 20+len(ev))
		one = append(one, 1, 1)
		one = append(one, make([]byte, 16)...)
		one = binary.AppendUvarint(one, uint64(len(ev)))
		one = append(one, ev...)
		ps, err := fsm.DecodeEntry(one)
		if err != nil || len(ps) != 1 {
			continue
		}
		if l, ok := ps[0].Event.(fsm.Link); ok {
			out = append(out, positionedLink{linkHit: linkHit{link: l}, pos: int(i)})
		}
	}
	return out
}

// WriteText prints the explanation for people.
func (ex *Explanation) WriteText(w io.Writer) error {
	var b strings.Builder
	if ex.Model != "" {
		fmt.Fprintf(&b, "key %q of model %q\n", ex.Key, ex.Model)
	} else {
		fmt.Fprintf(&b, "key %q\n", ex.Key)
	}
	for _, n := range ex.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	for _, h := range ex.Histories {
		writeHistory(&b, h, "")
	}
	if ex.ChildSearch != "" {
		fmt.Fprintf(&b, "\nsub-agents routed through %q (%s): %d\n", ex.Key, ex.ChildSearch, len(ex.Children))
	}
	for _, c := range ex.Children {
		fmt.Fprintf(&b, "  child %q (parent %q, depth %d) linked at index %d, %s: %s\n",
			c.Child, c.Parent, c.Depth, c.Index, c.Time.Format(time.RFC3339Nano), statusText(c.Status, c.Reason))
		for _, h := range c.Histories {
			writeHistory(&b, h, "    ")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func statusText(s, reason string) string {
	if reason != "" {
		return s + " (" + reason + ")"
	}
	return s
}

func writeHistory(b *strings.Builder, h KeyHistory, indent string) {
	fmt.Fprintf(b, "%s%s fleet, key %q: %s\n", indent, h.Fleet, h.Key, plural(len(h.Items), "step"))
	for _, it := range h.Items {
		t := it.Time.Format(time.RFC3339Nano)
		switch it.Kind {
		case "touches":
			if it.Count == 1 {
				fmt.Fprintf(b, "%s  #%d  %s  touch\n", indent, it.Index, t)
			} else {
				fmt.Fprintf(b, "%s  #%d..#%d  %s .. %s  touches x%d\n", indent, it.Index, it.LastIndex, t, it.LastTime.Format(time.RFC3339Nano), it.Count)
			}
			continue
		case "bind":
			fmt.Fprintf(b, "%s  #%d  %s  bind -> %s  [%s] %s", indent, it.Index, t, it.Instance, statusText(it.Status, it.StatusReason), it.Outcome)
			if it.ConversationID != "" && it.ConversationID != h.Key {
				fmt.Fprintf(b, "; requested by conversation %q", it.ConversationID)
			}
			b.WriteString("\n")
		case "overflow":
			fmt.Fprintf(b, "%s  #%d  %s  overflow %s -> %s (%s, rebind=%v)  [%s] %s\n", indent, it.Index, t, it.From, it.To, it.Reason, it.Rebind,
				statusText(it.Status, it.StatusReason), it.Outcome)
		case "evict":
			fmt.Fprintf(b, "%s  #%d  %s  evict (%s)  [%s] %s", indent, it.Index, t, it.Reason, statusText(it.Status, it.StatusReason), it.Outcome)
			if it.Detail != "" {
				fmt.Fprintf(b, "; %s", it.Detail)
			}
			b.WriteString("\n")
		default:
			fmt.Fprintf(b, "%s  #%d  %s  %s  [%s] %s\n", indent, it.Index, t, it.Kind, it.Status, it.Outcome)
		}
		if d := it.Decision; d != nil {
			fmt.Fprintf(b, "%s        decided by edge %s, policy %s, request %s", indent, orDash(d.Edge), orDash(d.Policy), orDash(d.RequestID))
			if len(d.Candidates) > 0 {
				b.WriteString("; candidates:")
				for _, c := range d.Candidates {
					fmt.Fprintf(b, " %s score=%.3g cached=%d load=%d;", c.Instance, c.Score, c.CachedTokens, c.LoadTokens)
				}
			}
			b.WriteString("\n")
		}
		if ev := it.Evidence; ev != nil {
			fmt.Fprintf(b, "%s        evidence: rule %s;", indent, ev.Rule)
			for _, c := range ev.Candidates {
				fmt.Fprintf(b, " %s cached_blocks=%d load_tokens=%d queued=%d", c.Instance, c.CachedBlocks, c.LoadTokens, c.QueuedRequests)
				if len(c.State) > 0 {
					fmt.Fprintf(b, " [%s]", strings.Join(c.State, ","))
				}
				b.WriteString(";")
			}
			b.WriteString("\n")
		}
	}
	if h.Final != "" {
		fmt.Fprintf(b, "%s  now: %s\n", indent, h.Final)
	} else if len(h.Items) > 0 {
		fmt.Fprintf(b, "%s  now: unbound\n", indent)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
