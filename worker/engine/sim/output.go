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
func planOutput(seed uint64, maxTokens int, o *engine.OutputOptions) outputPlan {
	if o == nil {
		return textPlan(seed, maxTokens, nil)
	}
	if len(o.Tools) == 0 && o.ResponseFormat != "json_object" && o.ResponseFormat != "json_schema" && len(o.Stop) == 0 {
		return outputPlan{words: maxTokens, finish: "length"} // text made at the end
	}
	limit := maxTokens
	if o.StructuredMaxTokens > limit {
		limit = o.StructuredMaxTokens
	}
	if tools := chooseTools(o); len(tools) > 0 {
		return toolPlan(seed, limit, tools)
	}
	switch o.ResponseFormat {
	case "json_object":
		return jsonPlan(limit, `{"response":"`+outputText(seed, 4)+`"}`)
	case "json_schema":
		return jsonPlan(limit, schemaInstance(o.Schema, seed))
	}
	return textPlan(seed, maxTokens, o.Stop)
}

// chooseTools is the tool policy: which functions the answer calls (none:
// the answer is content).
func chooseTools(o *engine.OutputOptions) []engine.Tool {
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
	// Prefer the tools the user named; else the first one.
	var named []engine.Tool
	lower := strings.ToLower(o.LastUserText)
	for _, t := range o.Tools {
		if t.Name != "" && strings.Contains(lower, strings.ToLower(t.Name)) {
			named = append(named, t)
		}
	}
	if len(named) == 0 {
		named = o.Tools[:1]
	}
	if !o.ParallelToolCalls {
		named = named[:1]
	}
	return named
}

// textPlan is free text: words of the vocabulary, cut before the first
// stop sequence (finish "stop") or at maxTokens (finish "length").
func textPlan(seed uint64, maxTokens int, stop []string) outputPlan {
	if len(stop) == 0 {
		return outputPlan{words: maxTokens, finish: "length"} // text made at the end
	}
	p := outputPlan{finish: "length"}
	var b strings.Builder
	for i := 0; i < maxTokens; i++ {
		piece := outputChunk(seed, i)
		if cut, ok := stopCut(b.String(), piece, stop); ok {
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
// name, then its arguments (a minimal instance of the parameters schema)
// piece by piece; finish "tool_calls", or "length" when limit cuts it.
func toolPlan(seed uint64, limit int, tools []engine.Tool) outputPlan {
	p := outputPlan{finish: "tool_calls"}
	for i, t := range tools {
		if len(p.chunks) == limit {
			p.finish = "length"
			break
		}
		call := engine.ToolCall{ID: callID(seed, i), Name: t.Name}
		p.chunks = append(p.chunks, engine.Chunk{ToolIndex: i, ToolCall: &engine.ToolCall{ID: call.ID, Name: call.Name}})
		var args strings.Builder
		for _, s := range pieces(schemaInstance(t.Parameters, seed+uint64(i))) {
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
