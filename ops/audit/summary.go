package audit

import (
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/tether-project/tether/fsm"
)

// Summary describes a state: what `tether audit replay` prints.
type Summary struct {
	Index        uint64            `json:"index"`
	Time         time.Time         `json:"time"`
	Hash         string            `json:"hash"`
	FeatureLevel uint32            `json:"feature_level"`
	MaxBindings  uint64            `json:"max_bindings"`
	Bindings     int               `json:"bindings"`
	Links        int               `json:"links"`
	PerFleet     map[string]int    `json:"bindings_per_fleet"`
	PerInstance  []InstanceSummary `json:"bindings_per_instance"`
	Evictions    map[string]uint64 `json:"evictions_by_reason"`
	Overflows    map[string]uint64 `json:"overflows_by_reason"`
	Counters     CounterSummary    `json:"counters"`
	Nodes        []NodeSummary     `json:"nodes"`
}

// InstanceSummary is one instance's binding count (Status is the log's
// record of it; "" when the log has none, e.g. bound before any telemetry).
type InstanceSummary struct {
	Fleet    string `json:"fleet"`
	Instance string `json:"instance"`
	Status   string `json:"status,omitempty"`
	Bindings int    `json:"bindings"`
}

// CounterSummary are the state's cumulative apply counters.
type CounterSummary struct {
	BindsCreated    uint64 `json:"binds_created"`
	BindsExisting   uint64 `json:"binds_existing"`
	Rebinds         uint64 `json:"rebinds"`
	Touched         uint64 `json:"touched"`
	LinksCreated    uint64 `json:"links_created"`
	Rejected        uint64 `json:"rejected"`
	ConditionFailed uint64 `json:"condition_failed"`
	Duplicates      uint64 `json:"duplicates"`
}

// NodeSummary is an edge as its NodeInfo advertised it.
type NodeSummary struct {
	ID              string `json:"id"`
	Version         string `json:"version"`
	MaxFeatureLevel uint32 `json:"max_feature_level"`
}

// Summarize describes st (one pass over its bindings).
func Summarize(st *fsm.State) Summary {
	h := st.Hash()
	s := Summary{
		Index: st.Index(), Hash: hex.EncodeToString(h[:]), FeatureLevel: st.FeatureLevel(), MaxBindings: st.MaxBindings(),
		Bindings: st.Len(), Links: st.LinkCount(), PerFleet: map[string]int{}, Evictions: map[string]uint64{}, Overflows: map[string]uint64{},
	}
	if st.Time() != 0 {
		s.Time = time.Unix(0, st.Time()).UTC()
	}
	type fi struct {
		f fsm.Fleet
		i string
	}
	counts := map[fi]int{}
	st.ForEachBinding(func(b fsm.Binding) bool {
		counts[fi{b.Fleet, b.Instance}]++
		s.PerFleet[b.Fleet.String()]++
		return true
	})
	for k, n := range counts {
		is := InstanceSummary{Fleet: k.f.String(), Instance: k.i, Bindings: n}
		if rec, ok := st.Instance(k.i); ok {
			is.Status = rec.Status.String()
		}
		s.PerInstance = append(s.PerInstance, is)
	}
	for _, rec := range st.Instances() {
		if _, ok := counts[fi{rec.Fleet, rec.ID}]; !ok {
			s.PerInstance = append(s.PerInstance, InstanceSummary{Fleet: rec.Fleet.String(), Instance: rec.ID, Status: rec.Status.String()})
		}
	}
	slices.SortFunc(s.PerInstance, func(a, b InstanceSummary) int {
		if c := strings.Compare(a.Fleet, b.Fleet); c != 0 {
			return c
		}
		return strings.Compare(a.Instance, b.Instance)
	})
	c := st.Counters()
	for r, n := range c.Evictions {
		s.Evictions[r.String()] = n
	}
	for r, n := range c.Overflows {
		s.Overflows[r.String()] = n
	}
	s.Counters = CounterSummary{
		BindsCreated: c.BindsCreated, BindsExisting: c.BindsExisting, Rebinds: c.Rebinds, Touched: c.Touched,
		LinksCreated: c.LinksCreated, Rejected: c.Rejected, ConditionFailed: c.ConditionFailed, Duplicates: c.Duplicates,
	}
	for _, n := range st.Edges() {
		s.Nodes = append(s.Nodes, NodeSummary{ID: n.ID, Version: n.Version, MaxFeatureLevel: n.MaxFeatureLevel})
	}
	return s
}

// WriteText prints the summary for people.
func (s Summary) WriteText(w io.Writer) error {
	var b strings.Builder
	t := "-"
	if !s.Time.IsZero() {
		t = s.Time.Format(time.RFC3339Nano)
	}
	fmt.Fprintf(&b, "index:          %d\n", s.Index)
	fmt.Fprintf(&b, "log time:       %s\n", t)
	fmt.Fprintf(&b, "state hash:     %s\n", s.Hash)
	fmt.Fprintf(&b, "feature level:  %d\n", s.FeatureLevel)
	fmt.Fprintf(&b, "max bindings:   %d\n", s.MaxBindings)
	fmt.Fprintf(&b, "bindings:       %d (context %d, generation %d)\n", s.Bindings, s.PerFleet["context"], s.PerFleet["generation"])
	fmt.Fprintf(&b, "parent links:   %d\n", s.Links)
	b.WriteString("bindings per instance:\n")
	if len(s.PerInstance) == 0 {
		b.WriteString("  (none)\n")
	}
	for _, in := range s.PerInstance {
		status := in.Status
		if status == "" {
			status = "no log record"
		}
		fmt.Fprintf(&b, "  %-10s %-24s %8d  (%s)\n", in.Fleet, in.Instance, in.Bindings, status)
	}
	writeCounts(&b, "evictions by reason", s.Evictions)
	writeCounts(&b, "overflows by reason", s.Overflows)
	c := s.Counters
	fmt.Fprintf(&b, "apply counters: binds created %d, binds on bound keys %d, rebinds %d, touched %d, links %d, rejected %d, condition failed %d, duplicates %d\n",
		c.BindsCreated, c.BindsExisting, c.Rebinds, c.Touched, c.LinksCreated, c.Rejected, c.ConditionFailed, c.Duplicates)
	if len(s.Nodes) > 0 {
		b.WriteString("edges (NodeInfo):\n")
		for _, n := range s.Nodes {
			fmt.Fprintf(&b, "  %-16s version %-12s max feature level %d\n", n.ID, n.Version, n.MaxFeatureLevel)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeCounts(b *strings.Builder, title string, m map[string]uint64) {
	fmt.Fprintf(b, "%s:", title)
	if len(m) == 0 {
		b.WriteString(" none\n")
		return
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(b, " %s=%d", k, m[k])
	}
	b.WriteString("\n")
}
