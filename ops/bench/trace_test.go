package bench

import (
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// writeTrace writes v as a trace file (gzip-compressed when gz).
func writeTrace(t testing.TB, dir, name string, gz bool, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return writeRaw(t, dir, name, gz, data)
}

func writeRaw(t testing.TB, dir, name string, gz bool, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if gz {
		zw := gzip.NewWriter(f)
		if _, err := zw.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		return path
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	return path
}

type tReq = map[string]any

// traceDoc builds a trace document in the kv-cache-tester format.
func traceDoc(id string, reqs ...tReq) map[string]any {
	return map[string]any{"id": id, "block_size": 64, "hash_id_scope": "local", "tool_tokens": 10, "system_tokens": 10, "requests": reqs}
}

func req(t float64, in, out int, ids ...int) tReq {
	return tReq{"t": t, "type": "s", "model": "m", "in": in, "out": out, "hash_ids": ids}
}

func sub(t float64, agent string, reqs ...tReq) tReq {
	return tReq{"t": t, "type": "subagent", "agent_id": agent, "subagent_type": "Explore", "requests": reqs}
}

func TestLoadTracesGzipAndPlainNamespacesIDs(t *testing.T) {
	dir := t.TempDir()
	// Both traces use local ids 1, 2, 3: different blocks across traces.
	writeTrace(t, dir, "a.json.gz", true, traceDoc("trace_a", req(0, 192, 10, 1, 2, 3), req(5, 256, 10, 1, 2, 3, 4)))
	writeTrace(t, dir, "b.json", false, traceDoc("trace_b", req(0, 192, 10, 1, 2, 3)))
	writeRaw(t, dir, "README.md", false, []byte("not a trace"))
	w, err := LoadTraces(dir, TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Agents) != 2 || w.Agents[0].ID != "trace_a" || w.Agents[1].ID != "trace_b" {
		t.Fatalf("agents %v, want trace_a and trace_b in file order", agentIDs(w))
	}
	if w.BlockSize != 64 {
		t.Fatalf("block size %d", w.BlockSize)
	}
	a1, a2 := w.Agents[0].Steps[0].Request, w.Agents[0].Steps[1].Request
	b1 := w.Agents[1].Steps[0].Request
	if !slices.Equal(a1.Blocks, a2.Blocks[:3]) {
		t.Fatal("equal ids at equal positions in one trace must give equal blocks")
	}
	for i := range b1.Blocks {
		if slices.Contains(a1.Blocks, b1.Blocks[i]) || slices.Contains(a1.Keys, b1.Keys[i]) {
			t.Fatalf("trace_b block %d equals a trace_a block: local ids were not namespaced", i)
		}
	}
	if a2.PromptTokens != 256 || a2.OutputTokens != 10 || !a2.Stream {
		t.Fatalf("request fields %+v", a2)
	}
	if got := w.Agents[0].Steps[1].At; got != 5*time.Second {
		t.Fatalf("offset %v, want 5s", got)
	}
}

func TestLoadTracesSubAgentsAndSharedPrefix(t *testing.T) {
	dir := t.TempDir()
	writeTrace(t, dir, "p.json", false, traceDoc("parent",
		req(0, 128, 10, 1, 2),
		sub(10, "agent_001", req(0, 128, 5, 50, 51), req(2, 192, 5, 50, 51, 52)),
		sub(11, "agent_002", req(0, 128, 5, 50, 53)),
		req(30, 192, 10, 1, 2, 3),
		sub(40, "agent_001", req(0, 64, 5, 60)), // a reused agent id gets a distinct session id
	))
	w, err := LoadTraces(dir, TraceOptions{SharedPrefixBlocks: 2})
	if err != nil {
		t.Fatal(err)
	}
	root := w.Agents[0]
	steps := root.Steps
	if len(steps) != 5 || steps[1].SubAgent == nil || steps[2].SubAgent == nil || steps[4].SubAgent == nil {
		t.Fatalf("steps %+v", steps)
	}
	s1, s2, s3 := steps[1].SubAgent, steps[2].SubAgent, steps[4].SubAgent
	if s1.ID != "parent/agent_001" || s2.ID != "parent/agent_002" || s3.ID == s1.ID {
		t.Fatalf("sub-agent ids %q %q %q", s1.ID, s2.ID, s3.ID)
	}
	if s1.Parent != root || s2.Parent != root || !s1.SubAgent() || root.SubAgent() || s1.Root() != root || s1.Depth() != 1 {
		t.Fatal("sub-agents must name the parent conversation")
	}
	// Sub-agents launched back to back run together; the next request and
	// a later sub-agent start a new group.
	if steps[1].WithPrevious || !steps[2].WithPrevious || steps[3].WithPrevious || steps[4].WithPrevious {
		t.Fatalf("groups: %v %v %v %v", steps[1].WithPrevious, steps[2].WithPrevious, steps[3].WithPrevious, steps[4].WithPrevious)
	}
	if s1.Steps[1].At != 2*time.Second {
		t.Fatalf("a sub-agent's offsets are relative to its own start, got %v", s1.Steps[1].At)
	}
	// Siblings share their common prefix (shared blocks, then id 50) but
	// not the parent's.
	b1, b2 := s1.Steps[0].Request.Blocks, s2.Steps[0].Request.Blocks
	if len(b1) != 4 || b1[2] != b2[2] || b1[3] == b2[3] {
		t.Fatalf("sibling blocks %v / %v", b1, b2)
	}
	pb := root.Steps[0].Request.Blocks
	if pb[0] != b1[0] || pb[1] != b1[1] || pb[2] == b1[2] {
		t.Fatal("the shared prefix blocks must be common to every request, and only them")
	}
	if got := root.Steps[0].Request.PromptTokens; got != 128+2*64 {
		t.Fatalf("prompt tokens %d, want the shared prefix added", got)
	}
	st := w.Stats()
	if st.Conversations != 1 || st.SubAgents != 3 || st.Requests != 6 || st.SubRequests != 4 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLoadTracesStaggerAndSubsets(t *testing.T) {
	dir := t.TempDir()
	writeTrace(t, dir, "a.json", false, traceDoc("a", req(0, 64, 1, 1), req(500, 128, 1, 1, 2)))
	writeTrace(t, dir, "b.json", false, traceDoc("b", req(0, 64, 1, 1)))
	writeTrace(t, dir, "c.json", false, traceDoc("c", req(0, 640, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)))
	load := func(o TraceOptions) *Workload {
		t.Helper()
		w, err := LoadTraces(dir, o)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	w1, w2 := load(TraceOptions{Stagger: time.Minute}), load(TraceOptions{Stagger: time.Minute})
	distinct := map[time.Duration]bool{}
	for i, a := range w1.Agents {
		if a.Start < 0 || a.Start >= time.Minute || a.Start != w2.Agents[i].Start {
			t.Fatalf("%s starts at %v (and %v in a second load): want a fixed offset in [0, 1m)", a.ID, a.Start, w2.Agents[i].Start)
		}
		distinct[a.Start] = true
	}
	if len(distinct) < 2 {
		t.Fatal("staggered starts are all equal")
	}
	if w := load(TraceOptions{}); w.Agents[0].Start != 0 {
		t.Fatal("without stagger every conversation starts at 0")
	}
	if got := agentIDs(load(TraceOptions{MaxDuration: 100 * time.Second})); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("max duration kept %v", got)
	}
	if got := agentIDs(load(TraceOptions{Smallest: 2})); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("smallest 2 kept %v", got)
	}
	if got := agentIDs(load(TraceOptions{Limit: 1})); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("limit 1 kept %v", got)
	}
}

func TestLoadTracesErrorsNameTheFile(t *testing.T) {
	cases := []struct {
		name, body, want string
	}{
		{"truncated.json", `{"id": "x", "block_size": 64, "hash_id_scope": "local", "requests": [`, "malformed JSON"},
		{"garbage.json", `not json at all`, "malformed JSON"},
		{"scope.json", `{"id": "x", "block_size": 64, "hash_id_scope": "galaxy", "requests": [{"t":0,"type":"s","in":1,"out":1,"hash_ids":[1]}]}`, "hash_id_scope"},
		{"noid.json", `{"block_size": 64, "hash_id_scope": "local", "requests": [{"t":0,"type":"s","in":1,"out":1,"hash_ids":[1]}]}`, `missing "id"`},
		{"blocksize.json", `{"id": "x", "block_size": 0, "hash_id_scope": "local", "requests": [{"t":0,"type":"s","in":1,"out":1,"hash_ids":[1]}]}`, "block_size"},
		{"type.json", `{"id": "x", "block_size": 64, "hash_id_scope": "local", "requests": [{"t":0,"type":"q","in":1,"out":1,"hash_ids":[1]}]}`, `requests[0]: unknown "type" "q"`},
		{"negative.json", `{"id": "x", "block_size": 64, "hash_id_scope": "local", "requests": [{"t":0,"type":"s","in":-5,"out":1,"hash_ids":[1]}]}`, "negative token count"},
		{"notime.json", `{"id": "x", "block_size": 64, "hash_id_scope": "local", "requests": [{"type":"s","in":1,"out":1,"hash_ids":[1]}]}`, `missing "t"`},
		{"wrongtype.json", `{"id": "x", "block_size": 64, "hash_id_scope": "local", "requests": [{"t":"soon","type":"s","in":1,"out":1,"hash_ids":[1]}]}`, "field requests.t"},
		{"emptysub.json", `{"id": "x", "block_size": 64, "hash_id_scope": "local", "requests": [{"t":0,"type":"subagent","agent_id":"a","requests":[]}]}`, "has no requests"},
		{"trailing.json", `{"id": "x", "block_size": 64, "hash_id_scope": "local", "requests": [{"t":0,"type":"s","in":1,"out":1,"hash_ids":[1]}]} {}`, "trailing data"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			path := writeRaw(t, dir, c.name, false, []byte(c.body))
			_, err := LoadTraces(dir, TraceOptions{})
			if err == nil {
				t.Fatal("want an error")
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q should name %s and say %q", err, path, c.want)
			}
		})
	}
	t.Run("corrupt gzip", func(t *testing.T) {
		dir := t.TempDir()
		path := writeRaw(t, dir, "bad.json.gz", false, []byte{0x1f, 0x8b, 0x08, 0x00, 0x01, 0x02})
		_, err := LoadTraces(dir, TraceOptions{})
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("error %v should name %s", err, path)
		}
	})
	t.Run("duplicate ids", func(t *testing.T) {
		dir := t.TempDir()
		writeTrace(t, dir, "1.json", false, traceDoc("same", req(0, 64, 1, 1)))
		p2 := writeTrace(t, dir, "2.json", false, traceDoc("same", req(0, 64, 1, 1)))
		_, err := LoadTraces(dir, TraceOptions{})
		if err == nil || !strings.Contains(err.Error(), p2) || !strings.Contains(err.Error(), "already used") {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("empty dir", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := LoadTraces(dir, TraceOptions{}); err == nil || !strings.Contains(err.Error(), dir) {
			t.Fatalf("error %v should name %s", err, dir)
		}
	})
}

func agentIDs(w *Workload) []string {
	var ids []string
	w.Walk(func(a *Agent) { ids = append(ids, a.ID) })
	return ids
}

// TestTraceHalvesAreFixedAndDisjoint: the halves alternate over the traces
// sorted by id, whatever the file order, and together hold every trace.
func TestTraceHalvesAreFixedAndDisjoint(t *testing.T) {
	w := smallTraces(t) // t1, t2, t3
	ids := func(w *Workload) []string {
		var out []string
		for _, a := range w.Agents {
			out = append(out, a.ID)
		}
		return out
	}
	all := ids(w)
	if len(all) != 3 {
		t.Fatalf("agents %v", all)
	}
	tune, err := splitHalf(w.Agents, HalfTuning)
	if err != nil {
		t.Fatal(err)
	}
	val, err := splitHalf(w.Agents, HalfValidation)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(&Workload{Agents: tune}); len(got) != 2 || got[0] != "t1" || got[1] != "t3" {
		t.Fatalf("tuning half %v, want [t1 t3]", got)
	}
	if got := ids(&Workload{Agents: val}); len(got) != 1 || got[0] != "t2" {
		t.Fatalf("validation half %v, want [t2]", got)
	}
	if _, err := splitHalf(w.Agents, "test"); err == nil {
		t.Fatal("an unknown half was accepted")
	}
}
