package stored

import (
	"context"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/respid"
)

// A Responses stream's events name the client's ids only, an error
// event's message included.
func TestStreamedEventsNameTheClientsIDs(t *testing.T) {
	ids := &IDs{known: map[string]string{"resp_inner": "resp_t1client", "conv_inner": "conv_t1client"}}
	a := &api.Answer{Dialect: apireq.Responses, Cached: -1, IDs: ids}
	for in, want := range map[string]string{
		`data: {"type":"error","code":"server_error","message":"response resp_inner failed","param":null,"sequence_number":3}` + "\n":                        "response resp_t1client failed",
		`data: {"type":"response.created","response":{"object":"response","id":"resp_inner","conversation":{"id":"conv_inner"}},"sequence_number":0}` + "\n": `"conversation":{"id":"conv_t1client"}`,
	} {
		out := string(a.Line([]byte(in)))
		if !strings.Contains(out, want) || strings.Contains(out, "_inner") {
			t.Errorf("%s\n-> %s, want %s", in, out, want)
		}
	}
}

// The answer to a request naming an object whose instance cannot be
// reached names the client's id and the reason, never the hop's URL (the
// instance's address and its own id for the object).
func TestUnreachableNamesTheClientsIDOnly(t *testing.T) {
	hop := &url.Error{Op: "Get", URL: "https://10.0.0.7:9000/v1/conversations/conv_inner",
		Err: &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 9000}, Err: syscall.ECONNREFUSED}}
	ref := &Ref{Client: "conv_t1client", ID: respid.ID{Fleet: 2, Instance: "gen-2", Upstream: "conv_inner"}, URL: "https://10.0.0.7:9000"}
	for _, c := range []struct {
		err   *api.Error
		param string
	}{
		{ref.Unreachable(Conversation, hop), ""},
		{Prepared{Conv: ref}.Unreachable(hop), ""},
		{Prepared{Prev: ref, Conv: &Ref{Client: "other"}}.Unreachable(hop), "previous_response_id"},
	} {
		e := c.err
		if e.Status != 503 || e.RetryAfter <= 0 || e.Param != c.param || !strings.Contains(e.Message, "'conv_t1client'") ||
			!strings.Contains(e.Message, "gen-2") || !strings.Contains(e.Message, "connection refused") ||
			strings.Contains(e.Message, "conv_inner") || strings.Contains(e.Message, "10.0.0.7") {
			t.Errorf("%d (retry %s, param %q) %q", e.Status, e.RetryAfter, e.Param, e.Message)
		}
	}
	if got := HopFailure(context.DeadlineExceeded); got != "context deadline exceeded" {
		t.Errorf("HopFailure(deadline) = %q", got)
	}
}
