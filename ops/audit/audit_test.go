package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/progress"
	"github.com/tether-project/tether/test/leakcheck"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if bigDir != "" {
		os.RemoveAll(bigDir)
	}
	if code == 0 {
		if err := leakcheck.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left running:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func TestReplayFullArchiveReproducesTheHash(t *testing.T) {
	lb := newLogBuilder(t)
	lb.workload(40)
	want := lb.m.State()
	lb.writeArchive(archive.Options{}, 0)
	lb.writeRaftLog(1)

	var progressOut bytes.Buffer
	res, err := lb.open().Replay(context.Background(), ReplayOptions{Progress: progress.New(&progressOut, "replay")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Hash != want.Hash() || res.Index != want.Index() {
		t.Fatalf("replay reached index %d hash %x; the node had index %d hash %x", res.Index, res.Hash, want.Index(), want.Hash())
	}
	if res.Start.Snapshot != nil {
		t.Errorf("a complete archive should replay from the empty state, started from %s", res.Start)
	}
	if res.MismatchCount != 0 {
		t.Errorf("outcome mismatches on a healthy archive: %v", res.Mismatches)
	}
	if res.FromArchive != len(lb.records) || res.FromRaftLog != 0 {
		t.Errorf("entries from archive %d (want %d), from raft.db %d (want 0)", res.FromArchive, len(lb.records), res.FromRaftLog)
	}
	s := Summarize(res.State)
	if s.PerFleet["context"] != 40 || s.PerFleet["generation"] != 40 {
		t.Errorf("bindings per fleet %v, want 40 each", s.PerFleet)
	}
	var text bytes.Buffer
	if err := s.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"context    ctx-1", "generation gen-1", "evictions by reason: none", "edge-1"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, text.String())
		}
	}
}

func TestReplayUntilIndexAndTime(t *testing.T) {
	lb := newLogBuilder(t)
	lb.workload(10)
	midIndex := lb.index
	mid := lb.m.State()
	lb.workload(10) // a second round: binds on bound keys, more touches
	lb.writeArchive(archive.Options{}, 0)
	d := lb.open()

	res, err := d.Replay(context.Background(), ReplayOptions{UntilIndex: midIndex})
	if err != nil {
		t.Fatal(err)
	}
	if res.Hash != mid.Hash() {
		t.Fatalf("--until-index %d: hash %x, want %x", midIndex, res.Hash, mid.Hash())
	}
	res, err = d.Replay(context.Background(), ReplayOptions{UntilTime: time.Unix(0, mid.Time())})
	if err != nil {
		t.Fatal(err)
	}
	if res.Hash != mid.Hash() {
		t.Fatalf("--until-time: hash %x at index %d, want %x at %d", res.Hash, res.Index, mid.Hash(), mid.Index())
	}
}

// Retention trimmed the oldest records: the replay loads the newest
// snapshot, replays the archive after it, says which range was trimmed and
// still reproduces the node's hash.
func TestReplayAfterRetentionUsesTheSnapshot(t *testing.T) {
	lb := newLogBuilder(t)
	lb.workload(30)
	lb.snapshot()
	snapIndex := lb.index
	lb.workload(30)
	lb.entry(fsm.InstanceState{Instance: "ctx-2", Fleet: fsm.FleetContext, Status: fsm.InstanceDown})
	want := lb.m.State()
	lb.writeArchive(archive.Options{MaxEvents: 120}, 0)

	d := lb.open()
	b, err := d.Bounds()
	if err != nil {
		t.Fatal(err)
	}
	if b.TrimmedTo == 0 || b.TrimmedTo >= snapIndex {
		t.Fatalf("the test needs retention to trim below the snapshot (%d): trimmed %d..%d", snapIndex, b.TrimmedFrom, b.TrimmedTo)
	}
	res, err := d.Replay(context.Background(), ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Hash != want.Hash() {
		t.Fatalf("hash %x at %d, want %x at %d", res.Hash, res.Index, want.Hash(), want.Index())
	}
	if res.Start.Snapshot == nil || res.Start.Snapshot.Index != snapIndex {
		t.Fatalf("replay started from %s, want the snapshot at %d", res.Start, snapIndex)
	}
	notes := strings.Join(res.Notes, "\n")
	if !strings.Contains(notes, "trimmed indexes 1..") || !strings.Contains(notes, "snapshot") {
		t.Errorf("notes do not explain the trimmed range and the snapshot:\n%s", notes)
	}
	if got := Summarize(res.State).Evictions["instance_removed"]; got != 15 {
		t.Errorf("instance_removed evictions %d, want 15 (ctx-2 holds the odd conversations)", got)
	}
}

// The snapshot is older than what retention kept: raft.db fills the gap.
// Without raft.db the error says what is missing.
func TestReplayFillsASnapshotGapFromRaftLog(t *testing.T) {
	lb := newLogBuilder(t)
	lb.workload(10)
	lb.snapshot()
	snapIndex := lb.index
	lb.workload(40)
	want := lb.m.State()
	lb.writeArchive(archive.Options{MaxEvents: 40}, 0)

	d := lb.open()
	_, err := d.Replay(context.Background(), ReplayOptions{})
	if err == nil || !strings.Contains(err.Error(), "cannot rebuild the state") || !strings.Contains(err.Error(), "trimmed") {
		t.Fatalf("without raft.db: err %v, want a 'cannot rebuild' error naming the trimmed range", err)
	}
	d.Close()

	lb.writeRaftLog(snapIndex - 3)
	res, err := lb.open().Replay(context.Background(), ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Hash != want.Hash() {
		t.Fatalf("hash %x, want %x", res.Hash, want.Hash())
	}
	if res.FromRaftLog == 0 || res.Start.Snapshot == nil {
		t.Fatalf("expected the snapshot plus raft.db entries, got start %s, %d from raft.db", res.Start, res.FromRaftLog)
	}
}

func TestReplayReportsOutcomeMismatchesAndCorruptEntries(t *testing.T) {
	lb := newLogBuilder(t)
	lb.workload(5)
	// An archived outcome that disagrees with what apply does.
	lb.records[len(lb.records)-1].Outcomes[0].Status = fsm.StatusRejected
	lb.writeArchive(archive.Options{}, 0)
	res, err := lb.open().Replay(context.Background(), ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.MismatchCount != 1 || !strings.Contains(res.Mismatches[0].String(), "archived rejected, replayed applied") {
		t.Fatalf("mismatches %d %v, want one naming archived rejected vs replayed applied", res.MismatchCount, res.Mismatches)
	}

	lb2 := newLogBuilder(t)
	lb2.workload(3)
	lb2.writeArchive(archive.Options{}, 0)
	a, err := archive.Open(filepath.Join(lb2.dir, ArchiveFile), archive.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	bad := archive.Record{Index: lb2.index + 1, Time: lb2.time.Add(time.Second).UnixNano(), Data: []byte{1, 1, 0xff}}
	if err := a.Append([]archive.Record{bad}); err != nil {
		t.Fatal(err)
	}
	a.Close()
	_, err = lb2.open().Replay(context.Background(), ReplayOptions{})
	var re *ReplayError
	if !errors.As(err, &re) || re.Index != bad.Index || re.Partial == nil || re.Partial.Index != lb2.index {
		t.Fatalf("err %v: want a ReplayError at index %d with the state rebuilt up to %d", err, bad.Index, lb2.index)
	}
}

func TestOpenRefusesALiveFile(t *testing.T) {
	lb := newLogBuilder(t)
	lb.workload(2)
	lb.writeArchive(archive.Options{}, 0)
	live, err := archive.Open(filepath.Join(lb.dir, ArchiveFile), archive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	_, err = Open(lb.dir, Options{LockTimeout: 50 * time.Millisecond})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "copy the data directory first") {
		t.Fatalf("err %v, want ErrLocked saying to copy the data directory first", err)
	}
	if _, err := Open(t.TempDir(), Options{}); err == nil || !strings.Contains(err.Error(), "archive.db") {
		t.Fatalf("an empty dir: err %v, want one naming archive.db", err)
	}
}

func TestExplainParentKey(t *testing.T) {
	lb := newLogBuilder(t)
	lb.workload(3)
	lb.entry(fsm.Settings{MaxBindings: 100})
	parent := "parent-1"
	bindIdx, _ := lb.entry(fsm.Bind{Fleet: fsm.FleetContext, Key: parent, ConversationID: parent, Instance: "ctx-1", Decision: decision("edge-2", "ctx-1", "ctx-2")})
	lb.entry(fsm.Bind{Fleet: fsm.FleetContext, Key: parent, ConversationID: "child-a", Instance: "ctx-2", Decision: decision("edge-3", "ctx-2")}) // lost race
	lb.entry(fsm.Link{Child: "child-a", Parent: parent, Root: parent, Depth: 1},
		fsm.Bind{Fleet: fsm.FleetGeneration, Key: "child-a", ConversationID: "child-a", Instance: "gen-1", Decision: decision("edge-3", "gen-1")})
	for range 3 {
		lb.entry(fsm.Touch{Keys: []fsm.FleetKey{{Fleet: fsm.FleetContext, Key: parent}}, Links: []string{"child-a"}})
	}
	lb.entry(fsm.Link{Child: "child-b", Parent: parent, Root: parent, Depth: 1})
	lb.entry(fsm.Bind{Fleet: fsm.FleetGeneration, Key: "child-b", ConversationID: "child-b", Instance: "gen-1", Decision: decision("edge-1", "gen-1")})
	lb.entry(fsm.Link{Child: "other-child", Parent: "conv-0", Root: "conv-0", Depth: 1})
	ovIdx, _ := lb.entry(fsm.Overflow{Fleet: fsm.FleetContext, Key: parent, From: "ctx-1", To: "ctx-2", Reason: fsm.OverflowSaturated, Rebind: true,
		Decision: decision("edge-1", "ctx-2", "ctx-1")})
	lb.entry(fsm.Touch{Keys: []fsm.FleetKey{{Fleet: fsm.FleetContext, Key: parent}}})
	downIdx, rs := lb.entry(fsm.InstanceState{Instance: "ctx-2", Fleet: fsm.FleetContext, Status: fsm.InstanceDown})
	if len(rs[0].Evicted) == 0 {
		t.Fatal("setup: ctx-2 going down evicted nothing")
	}
	lb.writeArchive(archive.Options{}, 0)

	ex, err := lb.open().Explain(context.Background(), parent, ExplainOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctxHist := ex.Histories[0]
	var kinds []string
	for _, it := range ctxHist.Items {
		kinds = append(kinds, it.Kind)
	}
	if got := strings.Join(kinds, ","); got != "bind,bind,touches,overflow,touches,evicted" {
		t.Fatalf("context history kinds %s", got)
	}
	first, lost, touches, ov, evicted := ctxHist.Items[0], ctxHist.Items[1], ctxHist.Items[2], ctxHist.Items[3], ctxHist.Items[5]
	if first.Index != bindIdx || first.Outcome != "bound to ctx-1 (epoch "+itoa(bindIdx)+")" || first.Decision.Edge != "edge-2" ||
		len(first.Decision.Candidates) != 2 || first.Decision.Candidates[1].Instance != "ctx-2" {
		t.Errorf("first bind: %+v", first)
	}
	if !strings.Contains(lost.Outcome, "already bound to ctx-1") || lost.ConversationID != "child-a" {
		t.Errorf("losing bind: %+v", lost)
	}
	if touches.Count != 3 || touches.LastIndex <= touches.Index {
		t.Errorf("touch window: %+v", touches)
	}
	if ov.Index != ovIdx || ov.Outcome != "moved from ctx-1 to ctx-2 (epoch "+itoa(ovIdx)+")" || ov.Reason != "saturated" {
		t.Errorf("overflow: %+v", ov)
	}
	if evicted.Index != downIdx || evicted.Instance != "ctx-2" || evicted.Reason != "instance_removed" ||
		!strings.Contains(evicted.Outcome, "InstanceState: instance ctx-2 down") {
		t.Errorf("instance-down eviction: %+v", evicted)
	}
	if ctxHist.Final != "" {
		t.Errorf("final %q, want unbound", ctxHist.Final)
	}
	if len(ex.Children) != 2 || ex.Children[0].Child != "child-a" || ex.Children[1].Child != "child-b" {
		t.Fatalf("children %+v, want child-a and child-b (not other-child)", ex.Children)
	}
	for _, c := range ex.Children {
		if len(c.Histories) != 1 || c.Histories[0].Fleet != "generation" || c.Histories[0].Items[0].Decision == nil {
			t.Errorf("child %s: histories %+v, want its generation bind with the decision", c.Child, c.Histories)
		}
	}
	js, err := json.Marshal(ex)
	if err != nil {
		t.Fatal(err)
	}
	var back Explanation
	if err := json.Unmarshal(js, &back); err != nil || len(back.Children) != 2 || back.Histories[0].Items[2].Count != 3 ||
		back.Histories[0].Items[0].LastTime != (time.Time{}) || !bytes.Contains(js, []byte(`"last_time"`)) {
		t.Fatalf("explain JSON does not round-trip (%v): %s", err, js)
	}
	var text bytes.Buffer
	if err := ex.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"bind -> ctx-1", "touches x3", "overflow ctx-1 -> ctx-2", "decided by edge edge-2, policy kv_aware",
		`child "child-a"`, `child "child-b"`, "candidates: ctx-1 score=10"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
}

func TestExplainCapacityEvictionAndTrimmedHistory(t *testing.T) {
	lb := newLogBuilder(t)
	lb.workload(2)
	lb.entry(fsm.Settings{MaxBindings: 4}) // 4 bindings exist: full
	lb.entry(fsm.Bind{Fleet: fsm.FleetContext, Key: "newcomer", ConversationID: "newcomer", Instance: "ctx-1"})
	lb.writeArchive(archive.Options{}, 0)
	// conv-0's generation binding is the least recently used (its context
	// binding was touched since).
	ex, err := lb.open().Explain(context.Background(), "conv-0", ExplainOptions{Fleets: []fsm.Fleet{fsm.FleetGeneration}, NoChildren: true})
	if err != nil {
		t.Fatal(err)
	}
	items := ex.Histories[0].Items
	last := items[len(items)-1]
	if last.Kind != "evicted" || last.Reason != "capacity" || !strings.Contains(last.Outcome, `capacity: the state exceeded max_bindings when a Bind of context/"newcomer" applied`) {
		t.Fatalf("last item %+v, want a capacity eviction caused by newcomer's bind", last)
	}

	lb2 := newLogBuilder(t)
	lb2.workload(20)
	lb2.entry(fsm.Touch{Keys: []fsm.FleetKey{{Fleet: fsm.FleetContext, Key: "conv-1"}}})
	lb2.writeArchive(archive.Options{MaxEvents: 10}, 0)
	ex, err = lb2.open().Explain(context.Background(), "conv-1", ExplainOptions{Fleets: []fsm.Fleet{fsm.FleetContext}})
	if err != nil {
		t.Fatal(err)
	}
	if len(ex.Notes) == 0 || !strings.Contains(ex.Notes[0], "retention trimmed") || ex.Histories[0].Final != "unknown" {
		t.Fatalf("notes %v final %q: want the trimmed range noted and the binding unknown", ex.Notes, ex.Histories[0].Final)
	}
}

func TestExportNDJSON(t *testing.T) {
	lb := newLogBuilder(t)
	lb.workload(4)
	lb.entry(fsm.Annotation{Source: "operator", Text: "maintenance"})
	events := 0
	for _, r := range lb.records {
		ps, _ := r.Proposals()
		events += len(ps)
	}
	lb.writeArchive(archive.Options{}, 0)
	var out bytes.Buffer
	n, err := lb.open().Export(context.Background(), &out, ExportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n != events {
		t.Fatalf("exported %d events, the log holds %d", n, events)
	}
	sc := bufio.NewScanner(&out)
	lines, binds := 0, 0
	var prev uint64
	for sc.Scan() {
		lines++
		var ev struct {
			Index   uint64          `json:"index"`
			Time    string          `json:"time"`
			Type    string          `json:"type"`
			Fields  json.RawMessage `json:"fields"`
			Effects EffectsJSON     `json:"effects"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %d: %v: %s", lines, err, sc.Bytes())
		}
		if ev.Index < prev {
			t.Fatalf("line %d: index %d after %d", lines, ev.Index, prev)
		}
		prev = ev.Index
		if _, err := time.Parse(time.RFC3339Nano, ev.Time); err != nil {
			t.Fatalf("line %d: time %q: %v", lines, ev.Time, err)
		}
		if ev.Effects.Status != "applied" {
			t.Errorf("line %d: status %q", lines, ev.Effects.Status)
		}
		if ev.Type == "Bind" {
			binds++
			var f struct {
				Instance string           `json:"instance"`
				Decision fsm.DecisionJSON `json:"decision"`
			}
			if err := json.Unmarshal(ev.Fields, &f); err != nil || f.Instance == "" || f.Decision.Edge == "" {
				t.Errorf("bind fields %s: %v", ev.Fields, err)
			}
		}
	}
	if lines != n || binds != 8 {
		t.Fatalf("%d lines, %d binds; want %d lines and 8 binds", lines, binds, n)
	}
}

// stateLive answers verify's questions from a real machine that went on
// applying entries after the copy was taken (the edge's admin API is
// exercised end to end in test/ops).
type stateLive struct{ st *fsm.State }

func (s stateLive) StateHash(context.Context, uint64) (LiveHash, error) {
	h := s.st.Hash()
	return LiveHash{NodeID: "edge-1", Index: s.st.Index(), Hash: hex.EncodeToString(h[:])}, nil
}

func (s stateLive) Binding(_ context.Context, f fsm.Fleet, key string) (LiveBinding, bool, error) {
	b, ok := s.st.Lookup(f, key)
	return LiveBinding{Instance: b.Instance, Epoch: b.Epoch, BoundAt: time.Unix(0, b.BoundAt)}, ok, nil
}

func TestVerifyComparesHashesOrBindings(t *testing.T) {
	lb := newLogBuilder(t)
	lb.workload(12)
	lb.writeArchive(archive.Options{}, 0)
	copyState := lb.m.State()
	d := lb.open()

	rep, err := Verify(context.Background(), d, stateLive{copyState}, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Mode != "hash" || !strings.HasPrefix(rep.Message, "OK") {
		t.Fatalf("same state: %+v", rep)
	}

	// The live node moved on: conv-0 evicted and rebound elsewhere, conv-1
	// rebound by overflow; the rest unchanged.
	lb.entry(fsm.Evict{Fleet: fsm.FleetContext, Key: "conv-0", Reason: fsm.EvictAdmin})
	lb.entry(fsm.Overflow{Fleet: fsm.FleetContext, Key: "conv-1", From: "ctx-2", To: "ctx-1", Reason: fsm.OverflowUnhealthy, Rebind: true})
	rep, err = Verify(context.Background(), d, stateLive{lb.m.State()}, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Mode != "bindings" || rep.ChangedSince != 2 || rep.Conflicts != 0 || rep.Equal != 22 ||
		!strings.Contains(rep.Message, "no longer remembers the state hash at that index") {
		t.Fatalf("moved-on edge: %+v", rep)
	}
	// A moved-on edge that remembers the hash at the copy's index is
	// compared by hash.
	rep, err = Verify(context.Background(), d, rememberingLive{stateLive{lb.m.State()}, copyState}, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Mode != "hash" || rep.LiveIndex != copyState.Index() {
		t.Fatalf("moved-on edge that remembers the hash: %+v", rep)
	}

	// A live node that disagrees about a binding set before the copy.
	other := newLogBuilder(t)
	other.workload(12)
	other.entry(fsm.Evict{Fleet: fsm.FleetContext, Key: "conv-3", Reason: fsm.EvictAdmin})
	other.entry(fsm.Bind{Fleet: fsm.FleetContext, Key: "conv-3", ConversationID: "conv-3", Instance: "ctx-9"})
	forged := forgedLive{stateLive{other.m.State()}, "conv-3", 5}
	rep, err = Verify(context.Background(), d, forged, VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK || rep.Conflicts != 1 || !strings.HasPrefix(rep.Message, "MISMATCH") || !strings.Contains(rep.Message, `context/"conv-3"`) {
		t.Fatalf("conflicting edge: %+v", rep)
	}
}

// rememberingLive answers ?index=N with the state at exactly N, as an
// edge does for an index it still remembers.
type rememberingLive struct {
	stateLive
	past *fsm.State
}

func (s rememberingLive) StateHash(ctx context.Context, index uint64) (LiveHash, error) {
	if index != 0 && index == s.past.Index() {
		return stateLive{s.past}.StateHash(ctx, index)
	}
	return s.stateLive.StateHash(ctx, index)
}

// forgedLive reports one key with an old epoch but another instance: what
// an edge whose history diverged before the copy would say.
type forgedLive struct {
	stateLive
	key   string
	epoch uint64
}

func (f forgedLive) Binding(ctx context.Context, fl fsm.Fleet, key string) (LiveBinding, bool, error) {
	b, ok, err := f.stateLive.Binding(ctx, fl, key)
	if key == f.key && fl == fsm.FleetContext {
		b.Epoch, b.BoundAt = f.epoch, time.Time{}
	}
	return b, ok, err
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }
