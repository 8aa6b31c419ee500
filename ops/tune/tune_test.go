package tune

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hash64"
	"github.com/tether-project/tether/ops/audit"
	"github.com/tether-project/tether/ops/bench"
	"github.com/tether-project/tether/routing"
)

const blockSize = 64

// logged is an answer for a prompt of the given block keys, as an edge
// records it.
func logged(edge, inst, conv string, at time.Duration, keys []uint64) audit.LoggedAnswer {
	blocks := bench.ChainBlocks(keys)
	pos := fsm.AnswerPrefixPositions(len(blocks))
	fp := make([]uint32, len(pos))
	for i, p := range pos {
		fp[i] = uint32(blocks[p-1])
	}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return audit.LoggedAnswer{Edge: edge, CacheAnswer: fsm.CacheAnswer{Fleet: fsm.FleetContext, Instance: inst, ConversationID: conv,
		Source: fsm.KVSourceTetherWorker, AtUnixMilli: base.Add(at).UnixMilli(), BlockSize: blockSize,
		PromptTokens: uint32(len(keys) * blockSize), CachedTokens: uint32(len(keys) * blockSize / 2), Blocks: uint32(len(blocks)), Prefix: fp}}
}

func keys(tag string, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = hash64.Mix64(hash64.FNV1a(tag) + uint64(i))
	}
	return out
}

// Prompts that share blocks share them in the rebuilt workload (at least
// the fingerprinted positions they share); conversations become agents,
// linked ones sub-agents of their parents.
func TestRebuildKeepsSharingAndSubAgents(t *testing.T) {
	sys := keys("system", 30)
	turn1 := append(append([]uint64{}, sys...), keys("a1", 10)...)
	turn2 := append(append([]uint64{}, turn1...), keys("a2", 10)...)
	other := append(append([]uint64{}, sys...), keys("b1", 5)...)
	kid := append(append([]uint64{}, sys...), keys("k1", 3)...)
	log := &audit.AnswerLog{Links: map[string]string{"kid": "conv-a"}, Answers: []audit.LoggedAnswer{
		logged("edge-1", "w1", "conv-a", 0, turn1),
		logged("edge-2", "w2", "conv-b", time.Second, other),
		logged("edge-1", "w1", "kid", 2*time.Second, kid),
		logged("edge-1", "w1", "conv-a", 3*time.Second, turn2),
		logged("edge-1", "w1", "", 4*time.Second, keys("x", 2)),
	}}
	rec, err := Rebuild(log, fsm.FleetContext, 16, 0)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Requests != 5 || rec.Conversations != 3 || rec.SubAgents != 1 || len(rec.Edges) != 2 ||
		strings.Join(rec.Instances, ",") != "w1,w2" || rec.HitRate != 0.5 {
		t.Fatalf("rebuilt: %+v", rec)
	}
	agents := map[string]*bench.Agent{}
	rec.Workload.Walk(func(a *bench.Agent) { agents[a.ID] = a })
	a := agents["conv-a"]
	if len(a.Steps) != 3 || a.Steps[1].SubAgent != agents["kid"] || a.Steps[2].At != 3*time.Second || agents["kid"].Parent != a {
		t.Fatalf("conv-a's script: %+v", a.Steps)
	}
	shared := func(x, y *bench.Request) int {
		n := 0
		for n < len(x.Blocks) && n < len(y.Blocks) && x.Blocks[n] == y.Blocks[n] {
			n++
		}
		return n
	}
	r1, r2, rb := a.Steps[0].Request, a.Steps[2].Request, agents["conv-b"].Steps[0].Request
	// turn 2 extends turn 1 (40 blocks): the fingerprints at 1..32 match,
	// 40 is turn 1's last and not one of turn 2's positions.
	if got := shared(r1, r2); got < 32 || got > 40 {
		t.Fatalf("turn 2 shares %d of turn 1's 40 blocks in the replay", got)
	}
	// conv-b shares the 30-block system prompt: positions up to 24.
	if got := shared(r1, rb); got < 24 || got > 30 {
		t.Fatalf("conv-b shares %d blocks with conv-a (30 in production)", got)
	}
	if len(r2.Blocks) != 50 || r2.PromptTokens != 50*blockSize || r2.OutputTokens != 16 {
		t.Fatalf("turn 2 rebuilt: %d blocks, %d prompt tokens, %d output", len(r2.Blocks), r2.PromptTokens, r2.OutputTokens)
	}
	if _, err := Rebuild(log, fsm.FleetGeneration, 16, 0); err == nil {
		t.Fatal("a fleet without answers rebuilt")
	}
	if rec, err := Rebuild(log, fsm.FleetContext, 16, 2); err != nil || rec.Requests != 2 {
		t.Fatalf("at most 2 requests: %+v %v", rec, err)
	}
}

// agentLog is a recorded day in miniature: groups of agents, each group
// sharing a long system prompt, every conversation several turns, arriving
// over a minute through three edges onto three instances.
func agentLog() *audit.AnswerLog {
	log := &audit.AnswerLog{Links: map[string]string{}}
	insts := []string{"w1", "w2", "w3"}
	for g := range 4 {
		sys := keys(fmt.Sprintf("sys%d", g), 120)
		for c := range 6 {
			conv := fmt.Sprintf("g%d-c%d", g, c)
			prompt := append([]uint64{}, sys...)
			start := time.Duration(c*4+g) * time.Second
			for turn := range 4 {
				prompt = append(prompt, keys(fmt.Sprintf("%s-t%d", conv, turn), 12)...)
				at := start + time.Duration(turn)*3*time.Second
				log.Answers = append(log.Answers, logged(fmt.Sprintf("edge-%d", (c+turn)%3+1), insts[g%3], conv, at, append([]uint64{}, prompt...)))
			}
		}
	}
	return log
}

// On a recorded run, turning the cache weight off (placement by load
// alone) ranks below the shipped weights: the conversations of a group no
// longer find their system prompt cached.
func TestTuneRanksABadWeightBelowTheShippedOne(t *testing.T) {
	rec, err := Rebuild(agentLog(), fsm.FleetContext, 32, 0)
	if err != nil {
		t.Fatal(err)
	}
	base := routing.DefaultConfig()
	bad, err := ParseSet(base, "weights.cache=0")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), rec, Options{Base: base, Candidates: bad, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := rep.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", buf.String())
	if len(rep.Scores) != 2 || rep.Scores[0].Name != BaseName || rep.Scores[1].Name != "weights.cache=0" {
		t.Fatalf("ranking: %+v", rep.Scores)
	}
	if rep.Scores[0].HitRate <= rep.Scores[1].HitRate {
		t.Fatalf("the shipped weights' hit rate %.3f is not above the cache-blind one's %.3f", rep.Scores[0].HitRate, rep.Scores[1].HitRate)
	}
	if rep.Edges != 3 || len(rep.Instances) != 3 || rep.Requests != 96 {
		t.Fatalf("report: %+v", rep)
	}
}

func TestParseSetAndDefaults(t *testing.T) {
	base := routing.DefaultConfig()
	cs, err := ParseSet(base, "weights.queue=0.5, 2")
	if err != nil || len(cs) != 2 || cs[0].Config.Weights.Queue != 0.5 || cs[1].Name != "weights.queue=2" || cs[1].Config.Weights.Cache != base.Weights.Cache {
		t.Fatalf("parse: %+v %v", cs, err)
	}
	if cs, err := ParseSet(base, "overflow.rebind_after=90"); err != nil || cs[0].Config.Overflow.RebindAfter != 90*time.Second {
		t.Fatalf("rebind_after: %+v %v", cs, err)
	}
	for _, bad := range []string{"weights.cache", "nonsense=1", "weights.cache=x", "weights.cache=-1", "weights.cache=NaN"} {
		if _, err := ParseSet(base, bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if n := len(DefaultCandidates(base)); n != 13 {
		t.Fatalf("%d default candidates", n)
	}
	off := base
	off.Overflow.ReliefFactor, off.Overflow.QueuedRequests = 0, 8
	names := map[string]bool{}
	for _, c := range DefaultCandidates(off) {
		names[c.Name] = true
	}
	if !names["overflow.relief_factor=5"] || !names["overflow.queued_requests=4"] || !names["overflow.queued_requests=16"] {
		t.Fatalf("candidates around a base with relief off and a threshold of 8: %v", names)
	}
}

// Mean times to first token within half a step of the base configuration's
// tie with it, and the hit rate decides; a larger difference decides alone.
func TestRankTiesTTFTNoiseWithTheBase(t *testing.T) {
	scores := []Score{
		{Name: BaseName, TTFTMeanMs: 37.76, HitRate: 0.805},
		{Name: "weights.cache=0", TTFTMeanMs: 37.72, HitRate: 0.791},
		{Name: "faster", TTFTMeanMs: 30, HitRate: 0.5},
	}
	rank(scores)
	var names []string
	for _, s := range scores {
		names = append(names, s.Name)
	}
	if want := []string{"faster", BaseName, "weights.cache=0"}; !slices.Equal(names, want) {
		t.Fatalf("ranked %v, want %v", names, want)
	}
	if scores[0].Rank != 1 || scores[2].Rank != 3 {
		t.Fatalf("ranks %+v", scores)
	}
}
