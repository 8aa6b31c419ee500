package worker

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tether-project/tether/internal/apireq"
)

// The Conversations API (OpenAI's; shapes as openai-python's
// types/conversations and resources/conversations): POST /v1/conversations
// creates one (optional items, at most 20, and metadata); GET, POST
// (metadata) and DELETE /v1/conversations/{id}; POST and GET
// /v1/conversations/{id}/items (add at most 20; list with after, limit
// 1..100 default 20, order asc or desc default desc); GET and DELETE
// /v1/conversations/{id}/items/{item_id} (a delete answers the
// conversation). A Responses request naming a conversation gets its items
// before its input, and its input and output items appended once it
// completes. Unknown ids are 404 as OpenAI answers them ("Conversation with
// id '…' not found.", "Item with id '…' not found.", param and code null).
// vLLM and SGLang serve no Conversations API: a proxy worker holds its
// conversations itself and sends its engine the whole input.

// conversationRoute is the route of /v1/conversations and what follows.
func (s *Server) conversationRoute(rest string) (route, bool) {
	if rest == "" {
		return route{[]string{http.MethodPost}, s.handleCreateConversation}, true
	}
	id, sub, _ := strings.Cut(rest, "/")
	if id == "" {
		return route{}, false
	}
	switch {
	case sub == "":
		return route{[]string{http.MethodGet, http.MethodPost, http.MethodDelete}, func(w http.ResponseWriter, r *http.Request) { s.handleConversation(w, r, id) }}, true
	case sub == "items":
		return route{[]string{http.MethodGet, http.MethodPost}, func(w http.ResponseWriter, r *http.Request) { s.handleConversationItems(w, r, id) }}, true
	case strings.HasPrefix(sub, "items/") && len(sub) > len("items/") && !strings.Contains(sub[len("items/"):], "/"):
		item := sub[len("items/"):]
		return route{[]string{http.MethodGet, http.MethodDelete}, func(w http.ResponseWriter, r *http.Request) { s.handleConversationItem(w, r, id, item) }}, true
	}
	return route{}, false
}

// convNotFound is OpenAI's answer to a conversation id it does not hold.
func convNotFound(id string) *apiError {
	return newAPIError(http.StatusNotFound, "invalid_request_error", "", "", "Conversation with id '%s' not found.", truncate(id, 200))
}

func conversationObject(c convSnapshot) map[string]any {
	return map[string]any{"id": c.id, "object": "conversation", "created_at": c.created, "metadata": c.metadata}
}

// convAnswer writes an answer and counts it.
func (s *Server) convAnswer(w http.ResponseWriter, status int, v any) {
	s.metrics.requests.WithLabelValues("conversations", strconv.Itoa(status)).Inc()
	if e, ok := v.(*apiError); ok {
		writeAPIError(w, e)
		return
	}
	writeJSON(w, status, v)
}

// convBody reads and validates a Conversations body of op
// (apireq.ParseConversation); its items get ids (inputItems).
func (s *Server) convBody(r *http.Request, op apireq.ConversationOp) (*apireq.ConversationBody, *apiError) {
	body, release, aerr := s.readBody(r)
	if aerr != nil {
		return nil, aerr
	}
	defer release()
	cb, aerr := apireq.ParseConversation(op, body)
	if aerr != nil {
		return nil, aerr
	}
	if cb.Items != nil {
		cb.Items = inputItems(cb.Items)
	}
	return cb, nil
}

// handleCreateConversation is POST /v1/conversations.
func (s *Server) handleCreateConversation(w http.ResponseWriter, r *http.Request) {
	cb, aerr := s.convBody(r, apireq.ConversationCreate)
	if aerr != nil {
		s.convAnswer(w, aerr.Status, aerr)
		return
	}
	c := s.conversations.create("conv_"+randomID(), time.Now().Unix(), cb.Metadata, cb.Items)
	s.convAnswer(w, http.StatusOK, conversationObject(c))
}

// handleConversation is GET, POST (metadata) and DELETE
// /v1/conversations/{id}.
func (s *Server) handleConversation(w http.ResponseWriter, r *http.Request, id string) {
	switch r.Method {
	case http.MethodDelete:
		if !s.conversations.delete(id) {
			s.convAnswer(w, http.StatusNotFound, convNotFound(id))
			return
		}
		s.convAnswer(w, http.StatusOK, map[string]any{"id": id, "object": "conversation.deleted", "deleted": true})
	case http.MethodPost:
		cb, aerr := s.convBody(r, apireq.ConversationUpdate)
		if aerr != nil {
			s.convAnswer(w, aerr.Status, aerr)
			return
		}
		c, ok := s.conversations.setMetadata(id, cb.Metadata)
		if !ok {
			s.convAnswer(w, http.StatusNotFound, convNotFound(id))
			return
		}
		s.convAnswer(w, http.StatusOK, conversationObject(c))
	default:
		c, ok := s.conversations.get(id)
		if !ok {
			s.convAnswer(w, http.StatusNotFound, convNotFound(id))
			return
		}
		s.convAnswer(w, http.StatusOK, conversationObject(c))
	}
}

// handleConversationItems is POST (add) and GET (list)
// /v1/conversations/{id}/items.
func (s *Server) handleConversationItems(w http.ResponseWriter, r *http.Request, id string) {
	if r.Method == http.MethodGet {
		c, ok := s.conversations.get(id)
		if !ok {
			s.convAnswer(w, http.StatusNotFound, convNotFound(id))
			return
		}
		s.metrics.requests.WithLabelValues("conversations", "200").Inc()
		writeItemPage(w, r, c.items)
		return
	}
	cb, aerr := s.convBody(r, apireq.ConversationAddItems)
	if aerr != nil {
		s.convAnswer(w, aerr.Status, aerr)
		return
	}
	if !s.conversations.appendItems(id, cb.Items) {
		s.convAnswer(w, http.StatusNotFound, convNotFound(id))
		return
	}
	s.convAnswer(w, http.StatusOK, itemList(cb.Items, false))
}

// handleConversationItem is GET and DELETE
// /v1/conversations/{id}/items/{item_id}.
func (s *Server) handleConversationItem(w http.ResponseWriter, r *http.Request, id, itemID string) {
	notFound := newAPIError(http.StatusNotFound, "invalid_request_error", "", "", "Item with id '%s' not found.", truncate(itemID, 200))
	if r.Method == http.MethodDelete {
		c, ok, found := s.conversations.deleteItem(id, itemID)
		switch {
		case !ok:
			s.convAnswer(w, http.StatusNotFound, convNotFound(id))
		case !found:
			s.convAnswer(w, http.StatusNotFound, notFound)
		default:
			s.convAnswer(w, http.StatusOK, conversationObject(c))
		}
		return
	}
	c, ok := s.conversations.get(id)
	if !ok {
		s.convAnswer(w, http.StatusNotFound, convNotFound(id))
		return
	}
	for _, it := range c.items {
		if itemIDOf(it) == itemID {
			s.convAnswer(w, http.StatusOK, it)
			return
		}
	}
	s.convAnswer(w, http.StatusNotFound, notFound)
}

// itemList is a page of items in OpenAI's list shape.
func itemList(items []json.RawMessage, more bool) map[string]any {
	var first, last any
	if len(items) > 0 {
		first, last = itemIDOf(items[0]), itemIDOf(items[len(items)-1])
	}
	if items == nil {
		items = []json.RawMessage{}
	}
	return map[string]any{"object": "list", "data": items, "first_id": first, "last_id": last, "has_more": more}
}

// writeItemPage writes one page of items as the list endpoints page them:
// order asc or desc (default desc), after an item id, limit 1..100
// (default 20).
func writeItemPage(w http.ResponseWriter, r *http.Request, items []json.RawMessage) {
	q := r.URL.Query()
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			writeAPIError(w, badRequest("limit", "limit must be an integer 1..100, got %q", truncate(v, 40)))
			return
		}
		limit = n
	}
	switch o := q.Get("order"); o {
	case "", "asc", "desc":
	default:
		writeAPIError(w, badRequest("order", "Invalid value: '%s'. Supported values are: 'asc' and 'desc'.", truncate(o, 40)))
		return
	}
	list := append([]json.RawMessage(nil), items...)
	if q.Get("order") != "asc" {
		for i, j := 0, len(list)-1; i < j; i, j = i+1, j-1 {
			list[i], list[j] = list[j], list[i]
		}
	}
	if after := q.Get("after"); after != "" {
		for i, it := range list {
			if itemIDOf(it) == after {
				list = list[i+1:]
				break
			}
		}
	}
	more := len(list) > limit
	if more {
		list = list[:limit]
	}
	writeJSON(w, http.StatusOK, itemList(list, more))
}

// conversationInput puts the items of the request's conversation before
// its input.
func (s *Server) conversationInput(p *parsedRequest) *apiError {
	id := p.req.Responses.Conversation
	c, ok := s.conversations.get(id)
	if !ok {
		return convNotFound(id)
	}
	history, aerr := apireq.ItemsHistory(c.items, "conversation.items")
	if aerr != nil {
		return aerr
	}
	return p.req.WithHistory(history)
}

// appendTurn adds a response's input items and output items to its
// conversation (nothing once the conversation is gone).
func (s *Server) appendTurn(conv string, input []json.RawMessage, output any) {
	items := append([]json.RawMessage(nil), input...)
	var out []json.RawMessage
	if b, err := json.Marshal(output); err == nil {
		_ = json.Unmarshal(b, &out)
	}
	s.conversations.appendItems(conv, append(items, out...))
}
