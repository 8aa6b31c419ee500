package edge

import (
	"github.com/tether-project/tether/edge/route"
	"github.com/tether-project/tether/edge/tokenize"
	"github.com/tether-project/tether/fsm"
)

// logTokenizers says at start how each fleet's block keys are computed.
func (e *Edge) logTokenizers() {
	for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
		ft := e.catalogue.First().Tokenizers[f]
		dir, chatTemplate, ok := ft.Model()
		if !ok {
			continue // words: as every tether dev and simulator run
		}
		e.log.Info("fleet block keys from the model's tokenizer", "fleet", f.String(), "dir", dir,
			"block_size", ft.BlockSize(), "chat_template", chatTemplate)
		if !chatTemplate {
			e.log.Warn("the model's tokenizer_config.json has no chat_template: chat requests get no block keys", "fleet", f.String(), "dir", dir)
		}
	}
}

// promptKeys computes each fleet's prompt tokens and block keys of rq
// (edge/tokenize); words are the words tokenizer's tokens (parseBody).
func (e *Edge) promptKeys(rq *route.Request, words []uint32) {
	if rq.Model == nil {
		rq.Model = e.catalogue.First()
	}
	rq.Prompts = rq.Model.Tokenizers.Keys(tokenize.Request{Parsed: rq.Parsed, Words: words, Conversation: rq.ID.ConversationID,
		Adapter: rq.Adapter, Now: rq.Now}, rq.Model.Cfg.Aggregated(), e.log)
	rq.PromptTokens = rq.Prompts[fsm.FleetContext].Tokens
}
