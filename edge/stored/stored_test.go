package stored

import (
	"strings"
	"testing"

	"github.com/tether-project/tether/edge/api"
	"github.com/tether-project/tether/internal/apireq"
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
