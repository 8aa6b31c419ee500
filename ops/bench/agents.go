package bench

import (
	"fmt"
	"strings"
	"time"

	"github.com/tether-project/tether/internal/prefix"
)

// Pattern is one of the agent workload patterns of docs/agent-workloads.md.
type Pattern string

const (
	// PatternReAct: the 8-call agent. Every call sends a 1,500-token
	// system prompt and 800 tokens of tools, then its own context of 150,
	// 150, 200, … 450 tokens (the worked example of docs/agent-workloads.md: 3,750 ms of
	// prefill with random routing, 1,107 ms cache-aware).
	PatternReAct Pattern = "react"
	// PatternSupervisor: a supervisor (decomposition and synthesis calls)
	// with 4 worker sub-agents of 3, 4, 5 and 6 calls; everyone's prompt
	// starts with the same 600 tokens of common tools, then a role prompt
	// (supervisor 1,500, workers 1,200 tokens each).
	PatternSupervisor Pattern = "supervisor"
	// PatternFanout: a plan call, 5 parallel calls that extend the plan
	// with one source each, and an aggregation call; one session.
	PatternFanout Pattern = "fanout"
	// PatternRetry: a retry storm: the original call, a retry
	// with the error, 3 parallel narrower retries, a final retry; each
	// retry re-sends the original prompt plus error context.
	PatternRetry Pattern = "retry"
	// PatternTAG: the "tool marketplace" layer: 4 agent types whose
	// prompts start with the same 800-token tool block, then their own
	// 1,500-token system prompts; 4 calls each with a growing history;
	// one type starts per second.
	PatternTAG Pattern = "tag"
)

// AllPatterns lists the patterns in report order.
var AllPatterns = []Pattern{PatternReAct, PatternSupervisor, PatternFanout, PatternRetry, PatternTAG}

// ParsePattern parses --pattern.
func ParsePattern(s string) (Pattern, error) {
	for _, p := range AllPatterns {
		if string(p) == strings.TrimSpace(s) {
			return p, nil
		}
	}
	names := make([]string, len(AllPatterns))
	for i, p := range AllPatterns {
		names[i] = string(p)
	}
	return "", fmt.Errorf("bench: --pattern: unknown pattern %q (allowed: %s)", s, strings.Join(names, ", "))
}

// AgentOptions shape a synthetic workload.
type AgentOptions struct {
	Pattern Pattern
	// Executions of the pattern (default 1), started Interval apart.
	// Executions of one pattern share its prompts' system and tool parts
	// (the same agent type), not their contexts.
	Executions int
	Interval   time.Duration
	BlockSize  int // default prefix.DefaultBlockSize
	// OutputTokens per call (default 50).
	OutputTokens int
}

// SpecReAct are the worked example's figures for the 8-call agent
// (docs/agent-workloads.md).
var SpecReAct = struct {
	RandomMs, CacheAwareMs float64
}{3750, 1107}

// Agents builds the pattern's workload. Prompts are real chat messages,
// rendered and tokenized by internal/prefix exactly as an edge and a worker
// do, so the same workload replays in e2e mode.
func Agents(opts AgentOptions) (*Workload, error) {
	if opts.Executions == 0 {
		opts.Executions = 1
	}
	if opts.BlockSize == 0 {
		opts.BlockSize = prefix.DefaultBlockSize
	}
	if opts.OutputTokens == 0 {
		opts.OutputTokens = 50
	}
	if opts.Executions < 0 || opts.Executions > 100_000 || opts.Interval < 0 || opts.OutputTokens < 1 || opts.BlockSize < 1 {
		return nil, fmt.Errorf("bench: agents: invalid options (executions %d, interval %v, output tokens %d, block size %d)",
			opts.Executions, opts.Interval, opts.OutputTokens, opts.BlockSize)
	}
	b := &patternBuilder{opts: opts}
	w := &Workload{Name: "agents-" + string(opts.Pattern), BlockSize: opts.BlockSize}
	for x := 0; x < opts.Executions; x++ {
		start := time.Duration(x) * opts.Interval
		var agents []*Agent
		switch opts.Pattern {
		case PatternReAct:
			agents = []*Agent{b.react(x)}
		case PatternSupervisor:
			agents = []*Agent{b.supervisor(x)}
		case PatternFanout:
			agents = []*Agent{b.fanout(x)}
		case PatternRetry:
			agents = []*Agent{b.retry(x)}
		case PatternTAG:
			agents = b.tag(x)
		default:
			return nil, fmt.Errorf("bench: agents: unknown pattern %q", opts.Pattern)
		}
		for _, a := range agents {
			a.Start += start
		}
		w.Agents = append(w.Agents, agents...)
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	return w, nil
}

type patternBuilder struct{ opts AgentOptions }

// Words returns n deterministic whitespace-separated words named by source:
// equal (source, n) give equal text, and so equal tokens.
func Words(source string, n int) string {
	var sb strings.Builder
	sb.Grow(n * 9)
	h := stringHash(source)
	for j := 0; j < n; j++ {
		if j > 0 {
			sb.WriteByte(' ')
		}
		x := mix64(h + uint64(j)*0x9e3779b97f4a7c15)
		sb.WriteByte('w')
		for k := 0; k < 7; k++ {
			sb.WriteByte("abcdefghijklmnopqrstuvwxyz234567"[x&31])
			x >>= 5
		}
	}
	return sb.String()
}

// join concatenates text segments with a space.
func join(parts ...string) string {
	var keep []string
	for _, p := range parts {
		if p != "" {
			keep = append(keep, p)
		}
	}
	return strings.Join(keep, " ")
}

// request renders and tokenizes messages into a request.
func (b *patternBuilder) request(msgs ...prefix.Message) *Request {
	toks := prefix.Tokenize(prefix.RenderChat(msgs))
	blocks := prefix.BlockHashes(toks, b.opts.BlockSize)
	return &Request{
		PromptTokens: len(toks),
		OutputTokens: b.opts.OutputTokens,
		Keys:         blocks, // a synthetic block's chained hash names its content
		Blocks:       blocks,
		Messages:     msgs,
	}
}

func sys(text string) prefix.Message  { return prefix.Message{Role: "system", Content: text} }
func user(text string) prefix.Message { return prefix.Message{Role: "user", Content: text} }

func step(r *Request) Step           { return Step{Request: r} }
func parallel(r *Request) Step       { return Step{Request: r, WithPrevious: true} }
func execID(p Pattern, x int) string { return fmt.Sprintf("%s-%d", p, x) }

func (b *patternBuilder) react(x int) *Agent {
	id := execID(PatternReAct, x)
	system := join(Words("react/system", 1500), Words("react/tools", 800))
	a := &Agent{ID: id, Kind: "react"}
	for i := 0; i < 8; i++ {
		n := 150
		if i > 0 {
			n = 150 + 50*(i-1)
		}
		a.Steps = append(a.Steps, step(b.request(sys(system), user(Words(fmt.Sprintf("%s/call%d", id, i), n)))))
	}
	return a
}

func (b *patternBuilder) supervisor(x int) *Agent {
	id := execID(PatternSupervisor, x)
	common := Words("supervisor/common-tools", 600)
	supSystem := join(common, Words("supervisor/system", 1500))
	task := Words(id+"/task", 100)
	sup := &Agent{ID: id, Kind: "supervisor"}
	sup.Steps = append(sup.Steps, step(b.request(sys(supSystem), user(task))))
	var results []string
	for k := 0; k < 4; k++ {
		wid := fmt.Sprintf("%s/worker%d", id, k)
		w := &Agent{ID: wid, Parent: sup, Kind: fmt.Sprintf("worker%d", k)}
		wSystem := join(common, Words(fmt.Sprintf("supervisor/worker%d/system", k), 1200))
		history := Words(wid+"/subtask", 150)
		for j := 0; j < 3+k; j++ {
			w.Steps = append(w.Steps, step(b.request(sys(wSystem), user(history))))
			history = join(history, Words(fmt.Sprintf("%s/out%d", wid, j), 60), Words(fmt.Sprintf("%s/tool%d", wid, j), 120))
		}
		sup.Steps = append(sup.Steps, Step{SubAgent: w, WithPrevious: k > 0})
		results = append(results, Words(wid+"/result", 100))
	}
	sup.Steps = append(sup.Steps, step(b.request(sys(supSystem), user(join(append([]string{task}, results...)...)))))
	return sup
}

func (b *patternBuilder) fanout(x int) *Agent {
	id := execID(PatternFanout, x)
	system := join(Words("fanout/system", 1500), Words("fanout/tools", 800))
	query := Words(id+"/query", 50)
	plan := Words(id+"/plan", 60)
	a := &Agent{ID: id, Kind: "fanout"}
	a.Steps = append(a.Steps, step(b.request(sys(system), user(query))))
	var summaries []string
	for k := 0; k < 5; k++ {
		r := b.request(sys(system), user(join(query, plan, Words(fmt.Sprintf("%s/source%d", id, k), 150))))
		if k == 0 {
			a.Steps = append(a.Steps, step(r))
		} else {
			a.Steps = append(a.Steps, parallel(r))
		}
		summaries = append(summaries, Words(fmt.Sprintf("%s/summary%d", id, k), 80))
	}
	a.Steps = append(a.Steps, step(b.request(sys(system), user(join(append([]string{query, plan}, summaries...)...)))))
	return a
}

func (b *patternBuilder) retry(x int) *Agent {
	id := execID(PatternRetry, x)
	system := join(Words("retry/system", 1500), Words("retry/tools", 800))
	orig := join(Words(id+"/query", 50), Words(id+"/context", 150))
	err1 := join(orig, Words(id+"/error1", 80), Words(id+"/query2", 40))
	err2 := join(err1, Words(id+"/error2", 80))
	a := &Agent{ID: id, Kind: "retry"}
	a.Steps = append(a.Steps, step(b.request(sys(system), user(orig))), step(b.request(sys(system), user(err1))))
	for k := 0; k < 3; k++ {
		r := b.request(sys(system), user(join(err2, Words(fmt.Sprintf("%s/narrow%d", id, k), 60))))
		if k == 0 {
			a.Steps = append(a.Steps, step(r))
		} else {
			a.Steps = append(a.Steps, parallel(r))
		}
	}
	final := join(err2, Words(id+"/narrow2", 60), Words(id+"/error3", 100), Words(id+"/narrow3", 60))
	a.Steps = append(a.Steps, step(b.request(sys(system), user(final))))
	return a
}

func (b *patternBuilder) tag(x int) []*Agent {
	market := Words("tag/marketplace-tools", 800)
	var out []*Agent
	for t := 0; t < 4; t++ {
		id := fmt.Sprintf("%s/type%d", execID(PatternTAG, x), t)
		system := join(market, Words(fmt.Sprintf("tag/type%d/system", t), 1500))
		// Agents of the marketplace come and go: one type starts per
		// second, so a type's first call can find the tool block that an
		// earlier type left in a cache (simultaneous first calls would
		// all be cold).
		a := &Agent{ID: id, Kind: fmt.Sprintf("type%d", t), Start: time.Duration(t) * time.Second}
		history := Words(id+"/query", 150)
		for j := 0; j < 4; j++ {
			a.Steps = append(a.Steps, step(b.request(sys(system), user(history))))
			history = join(history, Words(fmt.Sprintf("%s/out%d", id, j), 60), Words(fmt.Sprintf("%s/tool%d", id, j), 120))
		}
		out = append(out, a)
	}
	return out
}
