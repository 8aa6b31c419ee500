package audit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/respid"
)

// ResponseExplanation says which instance holds a stored Responses API
// response and why: what its id says (edges mint self-routing ids,
// internal/respid) and the binding of its conversation the log held when
// the response was made.
type ResponseExplanation struct {
	ID string `json:"id"`
	// Authenticated: "yes" (the id's MAC checked with the given internal
	// key), "no" (it did not check: another cluster's, or forged), or
	// "unchecked" (no key given: the fields are as the id says).
	Authenticated string    `json:"authenticated"`
	Fleet         string    `json:"fleet"`
	Instance      string    `json:"instance"`
	Rank          int       `json:"rank"`
	BootID        uint64    `json:"boot_id,omitempty"`
	Conversation  string    `json:"conversation,omitempty"`
	Upstream      string    `json:"engine_response_id"`
	Edge          string    `json:"minted_by"`
	Minted        time.Time `json:"minted_at"`
	Continued     bool      `json:"continued"`
	// Why is the reason the response is on Instance, in words.
	Why string `json:"why"`
	// Binding is the conversation's history in the fleet (nil without a
	// conversation).
	Binding *KeyHistory `json:"binding,omitempty"`
	Notes   []string    `json:"notes,omitempty"`
}

// ExplainResponse explains the stored response id. internalKey, when
// given, authenticates the id; model names a model other than the edge's
// first, whose conversation keys are in its namespace.
func (d *DataDir) ExplainResponse(ctx context.Context, id string, internalKey []byte, model string) (*ResponseExplanation, error) {
	rid, err := respid.Decode(id)
	if err != nil {
		return nil, fmt.Errorf("audit: explain response: %q: %w", id, err)
	}
	ex := &ResponseExplanation{ID: id, Authenticated: "unchecked", Fleet: fsm.Fleet(rid.Fleet).String(), Instance: rid.Instance,
		Rank: rid.Rank, BootID: rid.BootID, Conversation: rid.Conversation, Upstream: rid.Upstream, Edge: rid.Edge,
		Minted: rid.Minted.UTC(), Continued: rid.Continued}
	if internalKey != nil {
		switch _, err := respid.NewCodec(internalKey).Parse(id); {
		case err == nil:
			ex.Authenticated = "yes"
		case errors.Is(err, respid.ErrForged):
			ex.Authenticated = "no"
		default:
			return nil, fmt.Errorf("audit: explain response: %q: %w", id, err)
		}
	}
	where := fmt.Sprintf("%s instance %s", ex.Fleet, rid.Instance)
	if rid.Rank >= 0 {
		where += fmt.Sprintf(" rank %d", rid.Rank)
	}
	switch {
	case rid.Continued:
		ex.Why = fmt.Sprintf("it continued a stored response (previous_response_id), so edge %s sent it to the %s that held that one: a stored response lives in the process that made it", rid.Edge, where)
	case rid.Conversation == "":
		ex.Why = fmt.Sprintf("the request named no conversation: edge %s placed it without a binding (nothing of it is in the log) on the %s", rid.Edge, where)
	}
	if rid.Conversation == "" {
		return ex, nil
	}
	b, err := d.Bounds()
	if err != nil {
		return nil, err
	}
	complete := b.TrimmedTo == 0 && len(b.Restores) == 0
	if !complete {
		ex.Notes = append(ex.Notes, horizonNote(b))
	}
	f, k := fsm.Fleet(rid.Fleet), fsm.ModelKey(model, rid.Conversation)
	recs, err := d.archive.History(f, k)
	if err != nil {
		return nil, fmt.Errorf("audit: explain response: %w", err)
	}
	h := buildHistory(f, k, recs, complete)
	ex.Binding = &h
	if ex.Why != "" {
		return ex, nil
	}
	ex.Why = bindingWhy(rid, h, ex.Fleet, where)
	return ex, nil
}

// bindingWhy explains a response of a conversation by the binding in force
// when it was made: the last applied placement (bind or overflow) logged
// before it, or the Bind the minting edge proposed beside it.
func bindingWhy(rid respid.ID, h KeyHistory, fleet, where string) string {
	var last, own *Item
	for i := range h.Items {
		it := &h.Items[i]
		if (it.Kind == "bind" || it.Kind == "overflow") && it.Status == fsm.StatusApplied.String() && !it.Time.After(rid.Minted) {
			last = it
		}
		// A new conversation is served at once and its Bind committed beside
		// it: the first applied Bind, by the minting edge, naming this
		// instance, recorded this very placement.
		if own == nil && it.Kind == "bind" && it.Status == fsm.StatusApplied.String() && it.Time.After(rid.Minted) &&
			it.Instance == rid.Instance && it.Decision != nil && it.Decision.Edge == rid.Edge {
			own = it
		}
	}
	switch {
	case last == nil && own != nil:
		return fmt.Sprintf("conversation %q was new: edge %s placed it on the %s at once and proposed its Bind beside the request; log entry #%d (%s) recorded that placement",
			rid.Conversation, rid.Edge, where, own.Index, own.Time.Format(time.RFC3339Nano))
	case last == nil:
		return fmt.Sprintf("conversation %q had no binding in the %s fleet's log before %s: edge %s placed it on the %s without one (a degraded or not yet recorded placement)",
			rid.Conversation, fleet, rid.Minted.UTC().Format(time.RFC3339Nano), rid.Edge, where)
	case last.Kind == "bind" && last.Instance == rid.Instance, last.Kind == "overflow" && last.To == rid.Instance:
		return fmt.Sprintf("conversation %q was bound to %s by log entry #%d (%s, %s): edge %s served it there, on the %s",
			rid.Conversation, rid.Instance, last.Index, last.Kind, last.Outcome, rid.Edge, where)
	}
	to := last.Instance
	if last.Kind == "overflow" {
		to = last.To
	}
	return fmt.Sprintf("conversation %q was bound to %s (log entry #%d) but edge %s served it on the %s: a failed hop retried elsewhere, or a placement the log had not recorded yet",
		rid.Conversation, to, last.Index, rid.Edge, where)
}

// WriteText prints the explanation for people.
func (ex *ResponseExplanation) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "response %q\n", ex.ID)
	fmt.Fprintf(&b, "  held by:        %s instance %s, rank %d, boot %x\n", ex.Fleet, ex.Instance, ex.Rank, ex.BootID)
	fmt.Fprintf(&b, "  engine's id:    %s\n", ex.Upstream)
	fmt.Fprintf(&b, "  minted by edge: %s at %s (authenticated: %s)\n", ex.Edge, ex.Minted.Format(time.RFC3339Nano), ex.Authenticated)
	if ex.Conversation != "" {
		fmt.Fprintf(&b, "  conversation:   %q\n", ex.Conversation)
	}
	fmt.Fprintf(&b, "  why:            %s\n", ex.Why)
	for _, n := range ex.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	if ex.Binding != nil {
		writeHistory(&b, *ex.Binding, "  ")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
