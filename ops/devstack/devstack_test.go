package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/edge/admin"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/test/leakcheck"
	"github.com/tether-project/tether/test/testhttp"
	"github.com/tether-project/tether/worker"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func startStack(t *testing.T, o Options) *Stack {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := Start(ctx, o)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { closeStack(t, st) })
	if err := st.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return st
}

func closeStack(t *testing.T, st *Stack) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := st.Close(ctx); err != nil {
		t.Errorf("close: %v", err)
	}
}

func httpClient(t *testing.T) *http.Client { return testhttp.Client(t, nil) }

// stackClient trusts st's CA (a plain client for a plaintext stack).
func stackClient(t *testing.T, st *Stack) *http.Client { return testhttp.Client(t, st.ClientTLS()) }

type chatReply struct {
	route  string
	cached int
}

func chat(t *testing.T, c *http.Client, st *Stack, n *EdgeNode, session, parent, user string) chatReply {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"model":      st.Model(),
		"max_tokens": 2,
		"messages": []map[string]string{
			{"role": "system", "content": strings.Repeat("you are a careful coding agent; ", 40)},
			{"role": "user", "content": user},
		},
	})
	post := func() (*http.Response, []byte) {
		req, err := http.NewRequest(http.MethodPost, n.URL()+"/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-session-id", session)
		if parent != "" {
			req.Header.Set(ParentHeader, parent)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s via %s: %v", session, n.ID, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	resp, b := post()
	// An edge whose Bind did not commit and apply within propose_timeout
	// (a loaded machine) answers 503 affinity_state_unknown with
	// Retry-After-Ms: a client comes back after the pause, and so does this
	// one, for a minute at most.
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); resp, b = post() {
		ms, _ := strconv.Atoi(resp.Header.Get("Retry-After-Ms"))
		if resp.StatusCode != http.StatusServiceUnavailable || ms <= 0 || !bytes.Contains(b, []byte(`"affinity_state_unknown"`)) {
			break
		}
		time.Sleep(min(time.Duration(ms)*time.Millisecond, time.Second))
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s via %s: %d %s", session, n.ID, resp.StatusCode, b)
	}
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: %v: %s", session, err, b)
	}
	return chatReply{route: resp.Header.Get(edge.HeaderRoute), cached: out.Usage.Details.Cached}
}

// contextInstance parses "context=ctx-1/0; generation=gen-2/3".
func contextInstance(t *testing.T, route string) string {
	t.Helper()
	inst, _ := contextHop(t, route)
	return inst
}

// contextRank is the rank of the route header's context hop.
func contextRank(t *testing.T, route string) string {
	t.Helper()
	_, rank := contextHop(t, route)
	return rank
}

func contextHop(t *testing.T, route string) (instance, rank string) {
	t.Helper()
	for _, part := range strings.Split(route, ";") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(part), "context="); ok {
			instance, rank, _ = strings.Cut(v, "/")
			return instance, rank
		}
	}
	t.Fatalf("no context hop in route header %q", route)
	return "", ""
}

// binding reads key's binding from n once n has applied it: a new key's
// Bind commits beside its first request, which may be answered before
// (not found: none within the deadline).
func binding(t *testing.T, n *EdgeNode, fleet fsm.Fleet, key string) (admin.BindingInfo, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		b, ok, err := n.Binding(ctx, fleet, key)
		if err != nil {
			t.Fatal(err)
		}
		if ok || ctx.Err() != nil {
			return b, ok
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// The stack serves a parent and a sub-agent through different edges onto one
// context instance, records its Raft addresses, and a second stack on the
// same data directory (new HTTP and worker ports) recovers the bindings.
// Over mutual TLS: the second stack reuses the data directory's CA, so the
// first stack's client still trusts it.
func TestRestartOnDataDirKeepsBindings(t *testing.T) {
	dir := t.TempDir()
	st := startStack(t, Options{DataDir: dir, MutualTLS: true})
	c := stackClient(t, st)
	if st.TemporaryDataDir() || st.DataDir() != dir {
		t.Fatalf("data dir %s (temporary %v), want %s kept", st.DataDir(), st.TemporaryDataDir(), dir)
	}
	edges := st.Edges()
	if len(edges) != DefaultEdges || len(st.Workers()) != DefaultContextWorkers+DefaultGenerationWorkers {
		t.Fatalf("%d edges, %d workers", len(edges), len(st.Workers()))
	}
	p := chat(t, c, st, edges[0], "parent-1", "", "plan")
	a := chat(t, c, st, edges[1], "child-a", "parent-1", "explore")
	inst := contextInstance(t, p.route)
	if got := contextInstance(t, a.route); got != inst {
		t.Fatalf("sub-agent on %s, parent on %s", got, inst)
	}
	for _, n := range edges {
		if b, ok := binding(t, n, fsm.FleetContext, "parent-1"); !ok || b.Instance != inst {
			t.Fatalf("%s: binding %+v (found %v), want %s", n.ID, b, ok, inst)
		}
	}
	raftAddrs := []string{}
	for _, n := range edges {
		raftAddrs = append(raftAddrs, n.RaftAddr)
	}
	respID := storeResponse(t, c, st, edges[0])
	closeStack(t, st)
	if _, err := os.Stat(filepath.Join(dir, manifestName)); err != nil {
		t.Fatalf("manifest: %v", err)
	}

	st2 := startStack(t, Options{DataDir: dir, MutualTLS: true})
	// The generated admin token is kept with the data (it changed on every
	// restart before, while the CA was kept).
	if st2.AdminToken() != st.AdminToken() {
		t.Fatalf("admin token %q after restart, was %q", st2.AdminToken(), st.AdminToken())
	}
	// So is the internal key: the response id minted before the restart
	// still authenticates, and the edge says why its response is gone (its
	// worker restarted), not that another cluster issued the id.
	if st2.InternalKey() != st.InternalKey() {
		t.Fatalf("internal key changed across the restart")
	}
	if status, body := getResponse(t, c, st2.Edges()[1], respID); status != http.StatusNotFound || !strings.Contains(body, "restarted since it stored the response") {
		t.Fatalf("GET a response stored before the restart: %d %s", status, body)
	}
	for i, n := range st2.Edges() {
		if n.RaftAddr != raftAddrs[i] {
			t.Fatalf("%s: raft address %s after restart, was %s", n.ID, n.RaftAddr, raftAddrs[i])
		}
		if b, ok := binding(t, n, fsm.FleetContext, "parent-1"); !ok || b.Instance != inst {
			t.Fatalf("after restart, %s: binding %+v (found %v), want %s", n.ID, b, ok, inst)
		}
	}
	b := chat(t, c, st2, st2.Edges()[2], "child-b", "parent-1", "explore more")
	if got := contextInstance(t, b.route); got != inst {
		t.Fatalf("after restart a new sub-agent went to %s, the parent's binding is %s", got, inst)
	}

	// A different cluster shape on the same directory is refused.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	closeStack(t, st2)
	if _, err := Start(ctx, Options{DataDir: dir, Edges: 5}); err == nil || !strings.Contains(err.Error(), "3-edge cluster") {
		t.Fatalf("start with 5 edges on a 3-edge data dir: %v", err)
	}
}

// storeResponse creates a stored Responses response through n and returns
// its id.
func storeResponse(t *testing.T, c *http.Client, st *Stack, n *EdgeNode) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": st.Model(), "input": "remember this", "max_output_tokens": 4})
	resp, err := c.Post(n.URL()+"/v1/responses", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var obj struct {
		ID string `json:"id"`
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &obj) != nil || obj.ID == "" {
		t.Fatalf("POST /v1/responses: %d %s", resp.StatusCode, b)
	}
	return obj.ID
}

// getResponse is GET /v1/responses/{id} through n.
func getResponse(t *testing.T, c *http.Client, n *EdgeNode, id string) (int, string) {
	t.Helper()
	resp, err := c.Get(n.URL() + "/v1/responses/" + id)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Killing the leader: a survivor takes over, bound conversations stay, the
// killed edge restarts on its data directory and catches up.
func TestKillAndRestartLeader(t *testing.T) {
	c := httpClient(t)
	st := startStack(t, Options{})
	if st.MutualTLS() || !strings.HasPrefix(st.Edges()[0].URL(), "http://") {
		t.Fatal("zero Options: want a plaintext stack")
	}
	dir := st.DataDir()
	leader := st.Leader()
	if leader == nil {
		t.Fatal("ready without a leader")
	}
	var other *EdgeNode
	for _, n := range st.Edges() {
		if n != leader {
			other = n
			break
		}
	}
	first := chat(t, c, st, other, "conv-kill", "", "hello")
	leader.Kill()
	if leader.Running() || leader.Edge() != nil {
		t.Fatal("killed edge still running")
	}
	again := chat(t, c, st, other, "conv-kill", "", "hello again")
	if contextInstance(t, again.route) != contextInstance(t, first.route) {
		t.Fatalf("conversation moved after the leader died: %s → %s", first.route, again.route)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := st.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if l := st.Leader(); l == nil || l == leader {
		t.Fatalf("leader after kill: %v", l)
	}
	if err := leader.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := leader.Restart(ctx); err == nil {
		t.Fatal("restarting a running edge succeeded")
	}
	if err := st.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if b, ok := binding(t, leader, fsm.FleetContext, "conv-kill"); !ok || b.Instance != contextInstance(t, first.route) {
		t.Fatalf("restarted edge: binding %+v (found %v)", b, ok)
	}
	closeStack(t, st)
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary data dir %s left behind: %v", dir, err)
	}
}

func TestOptionErrorsNameTheOption(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Edges: MaxNodes + 1}, "edges: must be 1..16"},
		{Options{ContextWorkers: -1}, "context workers"},
		{Options{Ranks: -2}, "ranks"},
		{Options{Port: 65535}, "port: edges need ports 65535..65537"},
		{Options{Host: "0.0.0.0"}, "host"},
		{Options{AdminToken: "short"}, "admin token: 5 bytes is too short"},
		{Options{TimeScale: -1}, "time scale"},
		{Options{Scope: 7}, "scope"},
		{Options{Model: "m", ModelAliases: []string{"m"}}, `model aliases: "m" is empty or named twice`},
		{Options{MaxModelLen: 1}, "max model len"},
	} {
		st, err := Start(ctx, c.o)
		if err == nil {
			_ = st.Close(ctx)
			t.Fatalf("%+v: started", c.o)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%+v: error %q does not mention %q", c.o, err, c.want)
		}
	}
}

func TestDataDirWithRaftStateButNoManifest(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "edge-2"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "edge-2", "raft.db"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Start(context.Background(), Options{DataDir: dir})
	if err == nil || !strings.Contains(err.Error(), "no devstack.json") {
		t.Fatalf("err = %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, manifestName), []byte(`{"version":9}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Start(context.Background(), Options{DataDir: dir})
	if err == nil || !strings.Contains(err.Error(), "version 9") {
		t.Fatalf("err = %v", err)
	}
}

// The admin token and the internal key: a given one wins and is not
// stored; else the data dir's; else a new one, stored with mode 0600.
func TestSecretsKeptInDataDir(t *testing.T) {
	for _, name := range []string{adminTokenName, internalKeyName} {
		dir := t.TempDir()
		v, from, err := secret(dir, name, "")
		if err != nil || len(v) < 16 || from != secretGenerated {
			t.Fatalf("%s: generated %q (%s): %v", name, v, from, err)
		}
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: stored file: %v %v", name, fi, err)
		}
		if again, from, err := secret(dir, name, ""); err != nil || again != v || from != secretKept {
			t.Fatalf("%s: second start: %q (%s) %v, want %q", name, again, from, err, v)
		}
		if given, from, err := secret(dir, name, "given-token-0123456789"); err != nil || given != "given-token-0123456789" || from != secretGiven {
			t.Fatalf("%s: given: %q (%s) %v", name, given, from, err)
		}
		if again, _, _ := secret(dir, name, ""); again != v {
			t.Fatalf("%s: a given value replaced the stored one: %q", name, again)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte("short\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := secret(dir, name, ""); err == nil || !strings.Contains(err.Error(), name) {
			t.Fatalf("%s: short stored value: %v", name, err)
		}
	}
}

func TestIdleInstancesAreNotKVStale(t *testing.T) {
	st := startStack(t, Options{Edges: 1, ContextWorkers: 1, GenerationWorkers: 1, Ranks: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var resp struct {
		Instances []admin.InstanceInfo `json:"instances"`
	}
	if err := st.Edges()[0].AdminGet(ctx, "instances", &resp); err != nil {
		t.Fatal(err)
	}
	inst := resp.Instances
	if len(inst) != 2 {
		t.Fatalf("instances %+v", inst)
	}
	for _, in := range inst {
		if !in.Healthy || in.KVStale {
			t.Fatalf("idle instance %s: healthy %v kv_stale %v", in.ID, in.Healthy, in.KVStale)
		}
	}
}

// Tool calls cross the disaggregated flow (context hop, then the generation
// worker's stream through the edge) as the worker produced them: streamed
// deltas with index, id and name, then finish_reason tool_calls.
func TestToolCallsStreamThroughTheEdge(t *testing.T) {
	st := startStack(t, Options{Edges: 1, ContextWorkers: 1, GenerationWorkers: 1, Ranks: 1})
	body := `{"model":"` + st.Model() + `","stream":true,"messages":[{"role":"user","content":"call get_weather"}],
	 "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]}`
	resp, err := httpClient(t).Post(st.Edges()[0].URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	var name, args, finish string
	for _, block := range strings.Split(string(b), "\n\n") {
		data, ok := strings.CutPrefix(strings.TrimSpace(block), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					ToolCalls []struct {
						Index    int `json:"index"`
						Function struct {
							Name      string `json:"name"`
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("chunk %s: %v", data, err)
		}
		for _, c := range ch.Choices {
			for _, tc := range c.Delta.ToolCalls {
				name += tc.Function.Name
				args += tc.Function.Arguments
			}
			if c.FinishReason != nil {
				finish = *c.FinishReason
			}
		}
	}
	var parsed map[string]string
	if name != "get_weather" || json.Unmarshal([]byte(args), &parsed) != nil || parsed["city"] == "" || finish != "tool_calls" {
		t.Fatalf("streamed call %q(%s), finish %q:\n%s", name, args, finish, b)
	}
}

// An edge removed from the cluster (remove-peer) leaves a kept data
// directory that starts again: the removed edge's directory is moved aside
// and it rejoins as a new voter, with the cluster's bindings (before: its
// tombstone stopped every later start, and with its directory wiped it
// bootstrapped nothing and waited forever). Adding the removed edge back
// with add-voter while it is halted is refused, naming the removal (before:
// "committed", leaving a dead voter).
func TestRemovedEdgeRejoinsOnRestart(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := Start(ctx, Options{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.WaitReady(ctx); err != nil {
		st.Close(ctx)
		t.Fatal(err)
	}
	c := stackClient(t, st)
	p := chat(t, c, st, st.Edges()[0], "parent-1", "", "plan")
	inst := contextInstance(t, p.route)
	leader := st.Leader()
	var victim *EdgeNode
	for _, n := range st.Edges() {
		if n != leader {
			victim = n
		}
	}
	if err := leader.Edge().Node().RemoveServer(ctx, victim.ID); err != nil {
		st.Close(ctx)
		t.Fatal(err)
	}
	waitUntil(t, ctx, victim.ID+" halted", func() bool { return errors.Is(victim.Edge().Node().FatalError(), cluster.ErrRemoved) })
	err = leader.Edge().Node().AddVoter(ctx, victim.ID, victim.RaftAddr)
	if !errors.Is(err, cluster.ErrBadRequest) || !strings.Contains(err.Error(), "was removed from the cluster at index") {
		st.Close(ctx)
		t.Fatalf("add-voter of the removed %s: %v, want a refusal naming the removal", victim.ID, err)
	}
	if peers := leader.Edge().Node().Status().Peers; len(peers) != 2 {
		t.Errorf("after the refused add-voter the configuration is %+v", peers)
	}
	if err := st.Close(ctx); err != nil {
		t.Logf("close with a removed edge: %v", err)
	}

	st2 := startStack(t, Options{DataDir: dir})
	asides, _ := filepath.Glob(filepath.Join(dir, victim.ID+".removed-*"))
	if len(asides) != 1 {
		t.Fatalf("the removed edge's old directory was not kept aside: %v", asides)
	}
	l2 := st2.Leader()
	if l2 == nil {
		t.Fatal("no leader after restart")
	}
	voters := 0
	for _, p := range l2.Edge().Node().Status().Peers {
		if p.Voter {
			voters++
		}
	}
	if voters != 3 {
		t.Fatalf("after restart %d voters: %+v", voters, l2.Edge().Node().Status().Peers)
	}
	for _, n := range st2.Edges() {
		waitUntil(t, ctx, n.ID+" has parent-1's binding", func() bool {
			b, ok, err := n.Binding(ctx, fsm.FleetContext, "parent-1")
			return err == nil && ok && b.Instance == inst
		})
	}
}

func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// A restarted stack's workers bind returning conversations to the ADP rank
// the affinity log recorded (before: the restarted worker placed them anew,
// ctx-1/1 became ctx-1/0). Round-robin placement makes a fresh worker's
// first placement rank 0, so a conversation recorded on another rank shows
// the difference.
func TestRestartRestoresWorkerRanks(t *testing.T) {
	dir := t.TempDir()
	rr := func(_ string, c *worker.Config) { c.ADP.AttentionDP.NewConvPlacement = "round_robin" }
	st := startStack(t, Options{DataDir: dir, ContextWorkers: 1, GenerationWorkers: 1, WorkerConfig: rr})
	c := stackClient(t, st)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Ranks are recorded from feature level 2 on, which the new cluster's
	// leader commits right after its election.
	waitUntil(t, ctx, "feature level 2", func() bool {
		return st.Edges()[0].Edge().Node().State().FeatureLevel() >= fsm.FeatureLevelRanks
	})
	ranks := map[string]string{}
	for i := range 3 {
		conv := "conv-" + strconv.Itoa(i)
		ranks[conv] = contextRank(t, chat(t, c, st, st.Edges()[0], conv, "", "plan").route)
	}
	// The log records each placement's rank (RankObserved) in the
	// background.
	for conv, rank := range ranks {
		waitUntil(t, ctx, conv+"'s rank "+rank+" in the log", func() bool {
			b, ok := st.Edges()[0].Edge().Node().State().Lookup(fsm.FleetContext, conv)
			return ok && b.HasRank && strconv.Itoa(int(b.Rank)) == rank
		})
	}
	closeStack(t, st)

	st2 := startStack(t, Options{DataDir: dir, ContextWorkers: 1, GenerationWorkers: 1, WorkerConfig: rr})
	c = stackClient(t, st2)
	// Last placed first: on a fresh round-robin worker it would get rank 0.
	for _, conv := range []string{"conv-2", "conv-1", "conv-0"} {
		if got := contextRank(t, chat(t, c, st2, st2.Edges()[1], conv, "", "next").route); got != ranks[conv] {
			t.Errorf("%s after the restart on rank %s, the log records %s", conv, got, ranks[conv])
		}
	}
}

// A stack started without a model serves tether-sim and the Agents SDK's
// default model name as one model (an agent built without a model runs
// against it as it is), and its workers take MaxModelLen as their context
// length. Before, the SDK's default name was a 404 and every max_tokens
// above 4096 a 400.
func TestStackServesTheAgentsSDKDefaultModelAndAContextLength(t *testing.T) {
	st := startStack(t, Options{Edges: 1, ContextWorkers: 1, GenerationWorkers: 1, Ranks: 1, MaxModelLen: 4000})
	if st.Model() != DefaultModel || len(st.ModelAliases()) != 1 || st.ModelAliases()[0] != AgentsSDKDefaultModel {
		t.Fatalf("model %s, aliases %v", st.Model(), st.ModelAliases())
	}
	c := stackClient(t, st)
	n := st.Edges()[0]
	resp, err := c.Get(n.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"id":"`+DefaultModel+`"`) || !strings.Contains(string(b), `"id":"`+AgentsSDKDefaultModel+`"`) {
		t.Fatalf("GET /v1/models: %s", b)
	}
	post := func(body string) (int, string) {
		resp, err := c.Post(n.URL()+"/v1/responses", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, b := post(`{"model":"` + AgentsSDKDefaultModel + `","input":"hello","reasoning":{"effort":"none"},"text":{"verbosity":"low"}}`); code != 200 || !strings.Contains(b, `"status":"completed"`) {
		t.Fatalf("the SDK's default model: %d %s", code, b)
	}
	if code, b := post(`{"model":"` + DefaultModel + `","input":"hello","max_output_tokens":4001}`); code != 400 ||
		!strings.Contains(b, "max_output_tokens=4001 cannot be greater than max_model_len=4000") {
		t.Fatalf("beyond the context: %d %s", code, b)
	}
}
