package bench

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// SessionOptions shape a multi-turn session workload as Dynamo's
// session-routing replay describes it (aiperf, a closed loop): Sessions
// conversations of Turns turns each, at most Concurrency of them at once
// (each client starts its next conversation when one ends, so at most that
// many requests are in flight), every turn sending the whole conversation
// so far plus InputTokens new tokens and answering OutputTokens.
type SessionOptions struct {
	Sessions     int
	Turns        int
	Concurrency  int
	InputTokens  int // new tokens each turn
	OutputTokens int
	BlockSize    int
	// SharedPrefixTokens is a system prompt common to every session.
	SharedPrefixTokens int
}

// DynamoSessionOptions is the shape of Dynamo's session-routing replay: 2,200
// sessions × 20 turns at concurrency 1,024 on 8 workers. The per-turn token
// counts are this harness's (DESIGN.md: the replay's own were not found).
var DynamoSessionOptions = SessionOptions{Sessions: 2200, Turns: 20, Concurrency: 1024, InputTokens: 1024, OutputTokens: 256, BlockSize: 64}

func (o SessionOptions) validate() error {
	switch {
	case o.Sessions < 1 || o.Sessions > 1_000_000:
		return fmt.Errorf("bench: sessions: --sessions must be 1..1000000, got %d", o.Sessions)
	case o.Turns < 1 || o.Turns > 1000:
		return fmt.Errorf("bench: sessions: --turns must be 1..1000, got %d", o.Turns)
	case o.Concurrency < 1:
		return fmt.Errorf("bench: sessions: --concurrency must be >= 1, got %d", o.Concurrency)
	case o.InputTokens < 1 || o.OutputTokens < 1 || o.SharedPrefixTokens < 0:
		return fmt.Errorf("bench: sessions: --input-tokens and --output-tokens must be >= 1, --shared-prefix-tokens >= 0")
	case o.BlockSize < 1:
		return fmt.Errorf("bench: sessions: block size must be >= 1, got %d", o.BlockSize)
	case int64(o.Turns)*int64(o.InputTokens+o.OutputTokens)+int64(o.SharedPrefixTokens) > 4_000_000:
		return fmt.Errorf("bench: sessions: a conversation's context would exceed 4M tokens")
	}
	return nil
}

// SessionWorkload builds the closed-loop workload: client c runs sessions c,
// c+Concurrency, c+2·Concurrency, … one after another.
func SessionWorkload(o SessionOptions) (*Workload, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	w := &Workload{Name: fmt.Sprintf("sessions-%dx%d-c%d", o.Sessions, o.Turns, o.Concurrency), BlockSize: o.BlockSize}
	var shared []uint64
	for i := 0; i < o.SharedPrefixTokens/o.BlockSize; i++ {
		shared = append(shared, namespaceKey(stringHash("tether-bench/sessions/system"), int64(i)))
	}
	prev := make([]*Agent, o.Concurrency)
	for s := 0; s < o.Sessions; s++ {
		a := &Agent{ID: fmt.Sprintf("session-%05d", s), Kind: "session"}
		ns := stringHash(a.ID)
		keys := append([]uint64(nil), shared...)
		tokens := len(shared) * o.BlockSize
		next := int64(0)
		grow := func(n int) {
			tokens += n
			for len(keys) < tokens/o.BlockSize {
				keys = append(keys, namespaceKey(ns, next))
				next++
			}
		}
		for t := 0; t < o.Turns; t++ {
			grow(o.InputTokens)
			k := append([]uint64(nil), keys...)
			a.Steps = append(a.Steps, Step{Request: &Request{PromptTokens: tokens, OutputTokens: o.OutputTokens, Stream: true, Keys: k, Blocks: ChainBlocks(k)}})
			grow(o.OutputTokens)
		}
		c := s % o.Concurrency
		if p := prev[c]; p != nil {
			p.Next, a.Chained = a, true
		}
		prev[c] = a
		w.Agents = append(w.Agents, a)
	}
	return w, w.Validate()
}

// WriteSessionTable prints the figures the session workload is judged by.
func WriteSessionTable(w io.Writer, rep *Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "| policy | edges | hit rate | TTFT p50 s | p95 s | p99 s | makespan s |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range rep.Policies {
		fmt.Fprintf(&b, "| %s | %d | %.3f | %.2f | %.2f | %.2f | %.0f |\n", s.Name, s.Edges, s.HitRate,
			s.TTFTP50Ms/1000, s.TTFTP95Ms/1000, s.TTFTP99Ms/1000, time.Duration(s.MakespanMs*float64(time.Millisecond)).Seconds())
	}
	_, err := io.WriteString(w, b.String())
	return err
}
