package route

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/edge/catalog"
	"github.com/tether-project/tether/edge/stored"
	"github.com/tether-project/tether/edge/tokenize"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/routing"
)

// Request is one inference request as the path carries it: its sanitized
// body (edge/api), the model it names, its identity, each fleet's prompt
// keys (edge/tokenize) and the stored response or conversation it names
// (edge/stored).
type Request struct {
	Dialect      apireq.Dialect
	Parsed       *apireq.Request
	Path         string
	Top          map[string]json.RawMessage // the body, without internal fields
	ModelName    string                     // the model the body names
	Model        *catalog.Model             // the model's fleets (edge/catalog)
	Adapter      string                     // the LoRA adapter the model names ("" the base model)
	Stream       bool
	IncludeUsage bool
	MaxTokens    int // requested completion tokens (0: not given)

	ID           routing.Identity
	Priority     routing.Priority
	PromptTokens int                // the context fleet's
	Prompts      [3]tokenize.Prompt // by fsm.Fleet: tokens and block keys
	RequestID    string
	Now          time.Time
	Hint         bool // the endpoint gets rank affinity (signed hint) when a sub-agent
	// PassHeaders are client headers every hop forwards (Anthropic's).
	PassHeaders http.Header
	// Refs are the stored response and the conversation a Responses
	// request names (edge/stored): the request goes to the instance
	// holding them.
	Refs stored.Prepared
}

// SetConversation writes the conversation id into the body's
// conversation_params (keeping other fields).
func (rq *Request) SetConversation(conv string) {
	cp := map[string]json.RawMessage{}
	if raw, ok := rq.Top["conversation_params"]; ok && !apireq.IsNull(raw) {
		_ = json.Unmarshal(raw, &cp)
	}
	v, _ := json.Marshal(conv)
	cp["conversation_id"] = v
	rq.Top["conversation_params"] = api.MustMarshal(cp)
}

// HopBody is the request body for one hop: the client's body with fields
// set or removed (api.HopBody).
func (rq *Request) HopBody(set map[string]json.RawMessage, del ...string) []byte {
	return api.HopBody(rq.Top, set, del...)
}

// Pinned is the stored response or conversation rq names (nil none): the
// instance that holds it serves rq.
func (rq *Request) Pinned() *stored.Ref {
	if rq.Refs.Prev != nil {
		return rq.Refs.Prev
	}
	return rq.Refs.Conv
}
