package sim

import (
	"strings"
	"unicode/utf8"

	"github.com/tether-project/tether/worker/engine"
)

// outputPlan is what a run emits, decided before admission so the rank's
// schedule knows the number of completion tokens: one chunk per token.
type outputPlan struct {
	// words > 0: free text of that many vocabulary words, generated as
	// played (no per-token allocation for long answers); else chunks.
	words  int
	chunks []engine.Chunk
	text   string
	calls  []engine.ToolCall
	finish string
}

// tokens is the plan's number of completion tokens.
func (p *outputPlan) tokens() int {
	if p.words > 0 {
		return p.words
	}
	return len(p.chunks)
}

// chunk is token i.
func (p *outputPlan) chunk(seed uint64, i int) engine.Chunk {
	if p.words > 0 {
		return engine.Chunk{Text: outputChunk(seed, i)}
	}
	return p.chunks[i]
}

// pieceBytes is how many bytes of a structured answer (JSON, tool call
// arguments) make one simulated token: about what BPE tokenizers give JSON.
const pieceBytes = 4

// mixSeed varies the prompt's output seed by the request's seed option.
func mixSeed(seed uint64, o *engine.OutputOptions) uint64 {
	if o == nil || o.Seed == nil {
		return seed
	}
	x := uint64(*o.Seed) + 0x9e3779b97f4a7c15
	x ^= x >> 31
	x *= 0x94d049bb133111eb
	return seed ^ x
}

// planOutput decides the answer (see DESIGN.md, "What the model answers").
// Without options (nil) the answer is maxTokens words of free text, as a
// request with vLLM's ignore_eos.
func planOutput(seed uint64, maxTokens int, o *engine.OutputOptions) outputPlan {
	if o == nil {
		return outputPlan{words: maxTokens, finish: "length"} // text made at the end
	}
	spans, asked := codeSpans(o.LastUserText)
	if tools := chooseTools(o, asked); len(tools) > 0 {
		return toolPlan(seed, maxTokens, tools, spans)
	}
	switch o.ResponseFormat {
	case "json_object":
		return jsonPlan(maxTokens, `{"response":"`+outputText(seed, 4)+`"}`)
	case "json_schema":
		return jsonPlan(maxTokens, schemaInstance(o.Schema, seed))
	}
	return textPlan(seed, maxTokens, o)
}

// chooseTools is the tool policy: which functions the answer calls (none:
// the answer is content). Under auto the model calls the tools the user
// names (in asked: the last user turn outside its backquoted spans, which
// are arguments), and answers in text when it names none or the tools
// already ran; required falls back to the first tool that starts no
// sub-agent.
func chooseTools(o *engine.OutputOptions, asked string) []engine.Tool {
	if len(o.Tools) == 0 {
		return nil
	}
	switch o.ToolChoice {
	case "none":
		return nil
	case "function":
		for _, t := range o.Tools {
			if t.Name == o.ToolName {
				return []engine.Tool{t}
			}
		}
		return nil
	case "required":
	default: // "auto"
		if o.ToolResults {
			return nil // the tools ran: answer with their results
		}
	}
	var named []engine.Tool
	for _, t := range o.Tools {
		if t.Name != "" && mentions(asked, t.Mention(), t.Subagent) {
			named = append(named, t)
		}
	}
	if len(named) == 0 && o.ToolChoice == "required" {
		named = []engine.Tool{fallbackTool(o.Tools)}
	}
	if len(named) > 1 && !o.ParallelToolCalls {
		named = named[:1]
	}
	return named
}

// fallbackTool is what tool_choice required calls when the user named no
// tool: the first tool that starts no sub-agent (a sub-agent spawning
// more sub-agents would never end), else the first tool.
func fallbackTool(tools []engine.Tool) engine.Tool {
	for _, t := range tools {
		if !t.Subagent {
			return t
		}
	}
	return tools[0]
}

// textPlan is free text: words of the vocabulary up to where the model
// stops on its own (answerLength, finish "stop"), cut before the first
// stop sequence (finish "stop") or at maxTokens (finish "length").
func textPlan(seed uint64, maxTokens int, o *engine.OutputOptions) outputPlan {
	n, finish := maxTokens, "length"
	if !o.IgnoreEOS {
		if own := max(answerLength(seed, o.LastUserText), o.MinTokens); own < maxTokens {
			n, finish = own, "stop"
		}
	}
	if len(o.Stop) == 0 {
		return outputPlan{words: n, finish: finish} // text made at the end
	}
	p := outputPlan{finish: finish}
	var b strings.Builder
	for i := 0; i < n; i++ {
		piece := outputChunk(seed, i)
		if cut, ok := stopCut(b.String(), piece, o.Stop); ok {
			if cut != "" {
				p.chunks = append(p.chunks, engine.Chunk{Text: cut})
				b.WriteString(cut)
			}
			p.finish = "stop"
			break
		}
		b.WriteString(piece)
		p.chunks = append(p.chunks, engine.Chunk{Text: piece})
	}
	if len(p.chunks) == 0 {
		// The stop sequence came first: the engine still ran one step.
		p.chunks = []engine.Chunk{{}}
	}
	p.text = b.String()
	return p
}

// stopCut reports whether a stop sequence ends within done+piece and, if
// so, the part of piece before it.
func stopCut(done, piece string, stop []string) (string, bool) {
	if len(stop) == 0 {
		return "", false
	}
	all := done + piece
	best := -1
	for _, s := range stop {
		// Only occurrences that piece completes: earlier ones were seen.
		from := max(0, len(done)-len(s)+1)
		if i := strings.Index(all[from:], s); i >= 0 && (best < 0 || from+i < best) {
			best = from + i
		}
	}
	if best < 0 {
		return "", false
	}
	if best < len(done) {
		return "", true
	}
	return all[len(done):best], true
}

// pieces splits s into chunks of about pieceBytes bytes on rune boundaries.
func pieces(s string) []string {
	var out []string
	for len(s) > 0 {
		n := min(pieceBytes, len(s))
		for n < len(s) && !utf8.RuneStart(s[n]) {
			n++
		}
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}

// jsonPlan is a JSON content answer of at most limit tokens.
func jsonPlan(limit int, doc string) outputPlan {
	p := outputPlan{finish: "stop"}
	var b strings.Builder
	for _, s := range pieces(doc) {
		if len(p.chunks) == limit {
			p.finish = "length"
			break
		}
		p.chunks = append(p.chunks, engine.Chunk{Text: s})
		b.WriteString(s)
	}
	if len(p.chunks) == 0 {
		p.chunks = []engine.Chunk{{}}
	}
	p.text = b.String()
	return p
}

// toolPlan is an answer of tool calls: per call one token for its id and
// name, then its arguments (a minimal instance of the parameters schema,
// its required string properties filled from spans, the user's backquoted
// text, in order over the calls) piece by piece; finish "tool_calls", or
// "length" when limit cuts it.
func toolPlan(seed uint64, limit int, tools []engine.Tool, spans []string) outputPlan {
	p := outputPlan{finish: "tool_calls"}
	for i, t := range tools {
		if len(p.chunks) == limit {
			p.finish = "length"
			break
		}
		call := engine.ToolCall{ID: callID(seed, i), Name: t.Name}
		p.chunks = append(p.chunks, engine.Chunk{ToolIndex: i, ToolCall: &engine.ToolCall{ID: call.ID, Name: call.Name}})
		doc, used := argumentsInstance(t.Parameters, seed+uint64(i), spans)
		spans = spans[used:]
		var args strings.Builder
		for _, s := range pieces(doc) {
			if len(p.chunks) == limit {
				p.finish = "length"
				break
			}
			p.chunks = append(p.chunks, engine.Chunk{ToolIndex: i, ToolCall: &engine.ToolCall{Arguments: s}})
			args.WriteString(s)
		}
		call.Arguments = args.String()
		p.calls = append(p.calls, call)
	}
	return p
}

// callID is a deterministic OpenAI-style tool call id ("call_" + 24
// alphanumerics) for call i of the output seeded by seed.
func callID(seed uint64, i int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	x := seed ^ uint64(i+1)*0xbf58476d1ce4e5b9
	out := make([]byte, 0, 29)
	out = append(out, "call_"...)
	for len(out) < cap(out) {
		x ^= x >> 29
		x *= 0x94d049bb133111eb
		x ^= x >> 32
		out = append(out, alphabet[x%uint64(len(alphabet))])
	}
	return string(out)
}
