package audit

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
)

// The million-event archive is built once per test binary (it takes tens
// of seconds) and removed by TestMain.
var (
	bigOnce sync.Once
	bigDir  string
	bigErr  error
)

const (
	bigEvents          = 1_000_000
	bigEventsPerRecord = 48
	bigParents         = 20_000
)

// buildBigArchive writes an archive of about a million events shaped like
// an agentic fleet's log: batches of new conversations (context and
// generation binds), sub-agent links and binds, multi-key touches, the odd
// overflow; every entry applied to a real machine for its outcomes.
func buildBigArchive() (string, error) {
	dir, err := os.MkdirTemp("", "tether-audit-bench-*")
	if err != nil {
		return "", err
	}
	a, err := archive.Open(filepath.Join(dir, ArchiveFile), archive.Options{NoSync: true})
	if err != nil {
		return dir, err
	}
	defer a.Close()
	m := fsm.NewMachine()
	t0 := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	var (
		index, events, nextParent, nextID uint64
		pending                           []archive.Record
		props                             []fsm.Proposal
	)
	add := func(ev fsm.Event) {
		nextID++
		var id fsm.ProposalID
		copy(id[:], strconv.FormatUint(nextID, 36))
		props = append(props, fsm.Proposal{ID: id, Event: ev})
	}
	inst := func(i uint64, fleet string) string { return fmt.Sprintf("%s-%d", fleet, i%16) }
	for events < bigEvents {
		props = props[:0]
		for len(props) < bigEventsPerRecord {
			p := nextParent % bigParents
			key := parentKey(p)
			if nextParent < bigParents {
				d := fsm.Decision{Edge: "edge-" + strconv.Itoa(int(p%3)+1), Policy: "kv_aware", RequestID: "r" + key,
					Candidates: []fsm.Candidate{{Instance: inst(p, "ctx"), Score: 3, CachedTokens: 512}, {Instance: inst(p+1, "ctx"), Score: 1}}}
				add(fsm.Bind{Fleet: fsm.FleetContext, Key: key, ConversationID: key, Instance: inst(p, "ctx"), Decision: d})
				add(fsm.Bind{Fleet: fsm.FleetGeneration, Key: key, ConversationID: key, Instance: inst(p, "gen"), Decision: d})
				for c := range 2 {
					child := fmt.Sprintf("%s-child-%d", key, c)
					add(fsm.Link{Child: child, Parent: key, Root: key, Depth: 1})
					add(fsm.Bind{Fleet: fsm.FleetGeneration, Key: child, ConversationID: child, Instance: inst(p+uint64(c)+1, "gen"), Decision: d})
				}
			} else {
				// Later turns: touches of a parent and its children's keys.
				add(fsm.Touch{Keys: []fsm.FleetKey{{Fleet: fsm.FleetContext, Key: key}, {Fleet: fsm.FleetGeneration, Key: key},
					{Fleet: fsm.FleetGeneration, Key: key + "-child-0"}}, Links: []string{key + "-child-0"}})
				if nextParent%97 == 0 {
					add(fsm.Overflow{Fleet: fsm.FleetContext, Key: key, From: inst(p, "ctx"), To: inst(p+5, "ctx"), Reason: fsm.OverflowSaturated})
				}
			}
			nextParent++
		}
		data, err := fsm.EncodeEntry(props)
		if err != nil {
			return dir, err
		}
		index++
		e := fsm.Entry{Index: index, Time: t0.Add(time.Duration(index) * 10 * time.Millisecond).UnixNano(), Data: data}
		rs, err := m.Apply(e)
		if err != nil {
			return dir, err
		}
		pending = append(pending, archive.Record{Index: e.Index, Time: e.Time, Data: data, Outcomes: archive.OutcomesFromResults(rs)})
		events += uint64(len(props))
		if len(pending) == 512 {
			if err := a.Append(pending); err != nil {
				return dir, err
			}
			pending = pending[:0]
		}
	}
	return dir, a.Append(pending)
}

func bigArchive(b *testing.B) string {
	bigOnce.Do(func() { bigDir, bigErr = buildBigArchive() })
	if bigErr != nil {
		b.Fatal(bigErr)
	}
	return bigDir
}

// BenchmarkExplain1M explains a parent key (its binds, touch windows and
// overflows from the per-key index, and its two sub-agents found by the
// Link scan) in an archive of a million events. The ms/explain figure is
// meant to stay under a second.
func BenchmarkExplain1M(b *testing.B) {
	dir := bigArchive(b)
	d, err := Open(dir, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	n, _ := d.Archive().Events()
	key := parentKey(4242)
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		ex, err := d.Explain(context.Background(), key, ExplainOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if len(ex.Children) != 2 || len(ex.Histories[0].Items) < 2 {
			b.Fatalf("explain %s: %d children, %d context items", key, len(ex.Children), len(ex.Histories[0].Items))
		}
	}
	b.ReportMetric(float64(time.Since(start).Milliseconds())/float64(b.N), "ms/explain")
	b.ReportMetric(float64(n), "events")
}

// BenchmarkExplain1MOwnKeyOnly is the per-key-index part alone (no Link
// scan): what explain costs once the archive indexes Link roots.
func BenchmarkExplain1MOwnKeyOnly(b *testing.B) {
	d, err := Open(bigArchive(b), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	start := time.Now()
	for b.Loop() {
		if _, err := d.Explain(context.Background(), parentKey(4242), ExplainOptions{NoChildren: true}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N)/1000, "ms/explain")
}

// BenchmarkReplay1M replays the million-event archive from the empty state.
func BenchmarkReplay1M(b *testing.B) {
	d, err := Open(bigArchive(b), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	start := time.Now()
	for b.Loop() {
		res, err := d.Replay(context.Background(), ReplayOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if res.MismatchCount != 0 {
			b.Fatal(res.Mismatches)
		}
	}
	b.ReportMetric(time.Since(start).Seconds()/float64(b.N), "s/replay")
}

func parentKey(i uint64) string { return fmt.Sprintf("parent-%06d", i) }
