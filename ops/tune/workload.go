// Package tune answers "what would other routing weights and thresholds
// have scored on my own traffic?" (`tether audit tune`). It rebuilds the
// requests an edge log recorded (fsm.CacheAnswers: each request placed by
// the KV index, its conversation, time, prompt size and prefix
// fingerprints; the sub-agent links) into an ops/bench workload and replays
// it through the benchmark's simulator — the production routing decision,
// affinity log and simulated workers in virtual time — once per candidate
// configuration, ranking them by what each would have scored. See
// ops/audit/DESIGN.md "Tune".
package tune

import (
	"fmt"
	"slices"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/hash64"
	"github.com/tether-project/tether/ops/audit"
	"github.com/tether-project/tether/ops/bench"
)

// Recorded is the workload rebuilt from a log, and what the log says of
// the fleet it ran on.
type Recorded struct {
	Workload *bench.Workload
	// Instances are the fleet's instances that answered (sorted); Edges
	// the edges that recorded answers.
	Instances []string
	Edges     []string
	Requests  int
	// Conversations and SubAgents count the workload's agents.
	Conversations, SubAgents int
	// HitRate is the engines' own: cached over prompt tokens.
	HitRate float64
}

// Rebuild turns the log's answers of fleet f into a workload: one agent per
// conversation (sub-agents under their parents, by the log's links; a
// request without a conversation is an agent of its own), each request at
// its answer's offset from the first, its prompt's blocks synthesised from
// its fingerprints so that prompts share blocks up to the last fingerprint
// they share (at least two thirds of what they shared, alike for every
// candidate). At most
// maxRequests (0: all) of the earliest answers are used; each request
// generates outputTokens.
func Rebuild(log *audit.AnswerLog, f fsm.Fleet, outputTokens, maxRequests int) (*Recorded, error) {
	answers := make([]*audit.LoggedAnswer, 0, len(log.Answers))
	for i := range log.Answers {
		a := &log.Answers[i]
		if a.Fleet == f && a.BlockSize > 0 && a.Blocks > 0 && len(a.Prefix) > 0 {
			answers = append(answers, a)
		}
	}
	slices.SortStableFunc(answers, func(a, b *audit.LoggedAnswer) int { return int(a.AtUnixMilli - b.AtUnixMilli) })
	if maxRequests > 0 && len(answers) > maxRequests {
		answers = answers[:maxRequests]
	}
	if len(answers) == 0 {
		return nil, fmt.Errorf("tune: the log holds no answers of the %s fleet to replay", f)
	}
	rec := &Recorded{Workload: &bench.Workload{Name: "log", BlockSize: int(answers[0].BlockSize)}, Requests: len(answers)}
	agents, order, err := rec.agents(answers, outputTokens)
	if err != nil {
		return nil, err
	}
	adopt(agents, log.Links)
	for _, id := range order {
		a := agents[id]
		if a.Parent == nil {
			rec.Workload.Agents = append(rec.Workload.Agents, a)
			rec.Conversations++
		} else {
			rec.SubAgents++
		}
	}
	if err := rec.Workload.Validate(); err != nil {
		return nil, err
	}
	return rec, nil
}

// agents builds one agent per conversation with its requests.
func (rec *Recorded) agents(answers []*audit.LoggedAnswer, outputTokens int) (map[string]*bench.Agent, []string, error) {
	t0 := answers[0].AtUnixMilli
	agents := map[string]*bench.Agent{}
	var order []string
	instances, edges := map[string]bool{}, map[string]bool{}
	var prompt, cached int64
	for i, a := range answers {
		if int(a.BlockSize) != rec.Workload.BlockSize {
			return nil, nil, fmt.Errorf("tune: answers with block sizes %d and %d: replay one model at a time (--since/--until)", rec.Workload.BlockSize, a.BlockSize)
		}
		instances[a.Instance], edges[a.Edge] = true, true
		prompt += int64(a.PromptTokens)
		cached += int64(min(a.CachedTokens, a.PromptTokens))
		id := a.ConversationID
		if id == "" {
			id = fmt.Sprintf("unkeyed-%d", i)
		}
		at := time.Duration(a.AtUnixMilli-t0) * time.Millisecond
		ag := agents[id]
		if ag == nil {
			ag = &bench.Agent{ID: id, Start: at}
			agents[id] = ag
			order = append(order, id)
		}
		ag.Steps = append(ag.Steps, bench.Step{At: at - ag.Start, Request: request(a, outputTokens)})
	}
	for in := range instances {
		rec.Instances = append(rec.Instances, in)
	}
	for e := range edges {
		rec.Edges = append(rec.Edges, e)
	}
	slices.Sort(rec.Instances)
	slices.Sort(rec.Edges)
	if prompt > 0 {
		rec.HitRate = float64(cached) / float64(prompt)
	}
	return agents, order, nil
}

// request synthesises an answer's prompt: block j of the segment that ends
// at fingerprinted position p gets a key derived from p's fingerprint, so
// two prompts with the same fingerprint at p (the same chained hash: the
// same first p blocks) have the same first p blocks.
func request(a *audit.LoggedAnswer, outputTokens int) *bench.Request {
	n := int(a.Blocks)
	positions := fsm.AnswerPrefixPositions(n)
	keys := make([]uint64, n)
	seg := 0
	for j := 1; j <= n; j++ {
		for seg < len(positions)-1 && positions[seg] < j {
			seg++
		}
		fp := uint64(0)
		if seg < len(a.Prefix) {
			fp = uint64(a.Prefix[seg])
		}
		keys[j-1] = hash64.Mix64(fp<<32 ^ uint64(positions[seg])<<1 ^ hash64.Mix64(uint64(j)))
	}
	return &bench.Request{PromptTokens: max(int(a.PromptTokens), n*int(a.BlockSize)), OutputTokens: max(outputTokens, 1),
		Keys: keys, Blocks: bench.ChainBlocks(keys)}
}

// adopt makes each conversation the log links to a parent with answers a
// sub-agent of it: a step of the parent's script at the child's start
// (sub-agents launched together, with no request of the parent between
// them, run side by side as one group).
func adopt(agents map[string]*bench.Agent, links map[string]string) {
	starts := map[*bench.Agent]time.Duration{}
	for _, a := range agents {
		starts[a] = a.Start
	}
	for child, parent := range links {
		c, p := agents[child], agents[parent]
		if c == nil || p == nil || c == p || descends(p, c) {
			continue
		}
		c.Parent = p
	}
	for _, c := range agents {
		if c.Parent == nil {
			continue
		}
		p := c.Parent
		p.Steps = append(p.Steps, bench.Step{At: max(starts[c]-starts[p], 0), SubAgent: c})
		c.Start = 0
	}
	for _, a := range agents {
		slices.SortStableFunc(a.Steps, func(x, y bench.Step) int { return int(x.At - y.At) })
		for i := 1; i < len(a.Steps); i++ {
			a.Steps[i].WithPrevious = a.Steps[i].SubAgent != nil && a.Steps[i-1].SubAgent != nil
		}
	}
}

// descends reports whether a is b or one of b's descendants by the parents
// set so far.
func descends(a, b *bench.Agent) bool {
	for x := a; x != nil; x = x.Parent {
		if x == b {
			return true
		}
	}
	return false
}
