package worker

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

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

// maxItemsPerCall bounds the items one create adds (OpenAI's "up to 20
// items at a time").
const maxItemsPerCall = 20

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

// convBody reads a request body as a JSON object (an empty body is {}).
func (s *Server) convBody(r *http.Request) (map[string]json.RawMessage, *apiError) {
	body, release, aerr := s.readBody(r)
	if aerr != nil {
		return nil, aerr
	}
	defer release()
	top := map[string]json.RawMessage{}
	if len(bytes.TrimSpace(body)) == 0 {
		return top, nil
	}
	if json.Unmarshal(body, &top) != nil || top == nil {
		return nil, badRequest("", "the request body must be a JSON object")
	}
	return top, nil
}

// convMetadata validates metadata as OpenAI does: an object of at most 16
// string values, keys of at most 64 characters, values of at most 512
// (null or absent: {}).
func convMetadata(raw json.RawMessage) (json.RawMessage, *apiError) {
	if apireq.IsNull(raw) {
		return json.RawMessage("{}"), nil
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return nil, apireq.BadRequest("invalid_type", "metadata", "Invalid type for 'metadata': expected a metadata object, but got %s instead.", apireq.Kind(raw))
	}
	if len(m) > 16 {
		return nil, apireq.BadRequest("object_above_max_properties", "metadata",
			"Invalid 'metadata': too many properties. Expected an object with at most 16 properties, but got an object with %d properties instead.", len(m))
	}
	for k, v := range m {
		var s string
		switch {
		case utf8.RuneCountInString(k) > 64:
			return nil, apireq.BadRequest("", "metadata", "Invalid 'metadata': key %q is longer than 64 characters.", truncate(k, 80))
		case json.Unmarshal(v, &s) != nil:
			return nil, apireq.BadRequest("invalid_type", "metadata."+truncate(k, 64), "Invalid type for 'metadata.%s': expected a string, but got %s instead.", truncate(k, 64), apireq.Kind(v))
		case utf8.RuneCountInString(s) > 512:
			return nil, apireq.BadRequest("string_above_max_length", "metadata."+truncate(k, 64), "Invalid 'metadata.%s': string too long. Expected a string with maximum length 512.", truncate(k, 64))
		}
	}
	out, _ := json.Marshal(m)
	return out, nil
}

// convItems validates a body's items (required or not): at most 20 input
// items the Responses API takes, returned with ids (inputItems).
func convItems(top map[string]json.RawMessage, required bool) ([]json.RawMessage, *apiError) {
	raw, ok := top["items"]
	if !ok || apireq.IsNull(raw) {
		if required {
			return nil, apireq.Missing("items")
		}
		return nil, nil
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil, apireq.BadRequest("invalid_type", "items", "Invalid type for 'items': expected an array of input items, but got %s instead.", apireq.Kind(raw))
	}
	if len(items) > maxItemsPerCall {
		return nil, apireq.BadRequest("array_above_max_length", "items",
			"Invalid 'items': array too long. Expected an array with maximum length %d, but got an array with length %d instead.", maxItemsPerCall, len(items))
	}
	if _, aerr := apireq.ItemsHistory(items, "items"); aerr != nil {
		return nil, aerr
	}
	return inputItems(items), nil
}

// handleCreateConversation is POST /v1/conversations.
func (s *Server) handleCreateConversation(w http.ResponseWriter, r *http.Request) {
	top, aerr := s.convBody(r)
	if aerr != nil {
		s.convAnswer(w, aerr.Status, aerr)
		return
	}
	meta, aerr := convMetadata(top["metadata"])
	if aerr != nil {
		s.convAnswer(w, aerr.Status, aerr)
		return
	}
	items, aerr := convItems(top, false)
	if aerr != nil {
		s.convAnswer(w, aerr.Status, aerr)
		return
	}
	c := s.conversations.create("conv_"+randomID(), time.Now().Unix(), meta, items)
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
		top, aerr := s.convBody(r)
		if aerr == nil {
			if _, ok := top["metadata"]; !ok {
				aerr = apireq.Missing("metadata")
			}
		}
		var meta json.RawMessage
		if aerr == nil {
			meta, aerr = convMetadata(top["metadata"])
		}
		if aerr != nil {
			s.convAnswer(w, aerr.Status, aerr)
			return
		}
		c, ok := s.conversations.setMetadata(id, meta)
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
	top, aerr := s.convBody(r)
	var items []json.RawMessage
	if aerr == nil {
		items, aerr = convItems(top, true)
	}
	if aerr != nil {
		s.convAnswer(w, aerr.Status, aerr)
		return
	}
	if !s.conversations.appendItems(id, items) {
		s.convAnswer(w, http.StatusNotFound, convNotFound(id))
		return
	}
	s.convAnswer(w, http.StatusOK, itemList(items, false))
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
