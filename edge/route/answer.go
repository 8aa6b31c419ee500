package route

import (
	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/fsm"
)

// RecordAnswer grades h's claim (what the KV index said h's instance held
// of the prompt when the request was placed) against the engine's answer
// (the usage's prompt and cached tokens): it feeds this edge's breaker and
// figures (edge/fleetview grade.go) and queues the answer for the log
// (fsm.CacheAnswers, off the request path). It returns the graded answer,
// for the other edges; ok is false when there was nothing to grade (the
// hop made no claim: its router does not read the index; or a prompt
// shorter than a block).
func (e *Router) RecordAnswer(rq *Request, h *Hop, promptTokens, cachedTokens int) (a fleetview.Answer, ok bool) {
	if h == nil || !h.HasPrediction {
		return fleetview.Answer{}, false
	}
	now := e.now()
	fv := e.edge.Fleet()
	a = fleetview.Answer{Fleet: h.Fleet, Instance: h.Instance, Source: fv.Source(h.Instance, now),
		BlockSize: int64(rq.Model.Cfg.RoutingConfig(h.Fleet).BlockSize), PromptTokens: int64(promptTokens),
		PredictedTokens: int64(h.Predicted), CachedTokens: int64(cachedTokens)}
	if !fv.RecordAnswer(a, true, now) {
		return fleetview.Answer{}, false
	}
	blocks := rq.Prompts[h.Fleet].Blocks
	positions := fsm.AnswerPrefixPositions(len(blocks))
	prefix := make([]uint32, len(positions))
	for i, p := range positions {
		prefix[i] = uint32(blocks[p-1])
	}
	e.recorder.AddAnswer(fsm.CacheAnswer{Fleet: h.Fleet, Instance: h.Instance, ConversationID: rq.ID.ConversationID, Source: a.Source,
		AtUnixMilli: now.UnixMilli(), BlockSize: clampU32(a.BlockSize), PromptTokens: clampU32(a.PromptTokens),
		PredictedTokens: clampU32(a.PredictedTokens), CachedTokens: clampU32(min(a.CachedTokens, a.PromptTokens)),
		Blocks: clampU32(int64(len(blocks))), Prefix: prefix})
	return a, true
}

func clampU32(v int64) uint32 { return uint32(min(max(v, 0), 1<<32-1)) }
