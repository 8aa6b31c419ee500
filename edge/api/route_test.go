package api

import "testing"

func TestParseRoute(t *testing.T) {
	r, err := ParseRoute("context=ctx-1/3; generation=-/-")
	if err != nil || r != (Route{ContextInstance: "ctx-1", ContextRank: "3"}) {
		t.Fatalf("%+v %v", r, err)
	}
	r, err = ParseRoute("context=ctx-1/0; generation=gen-2/1; request=edge-1-7; context_state=12; context_key=own; generation_state=14")
	want := Route{ContextInstance: "ctx-1", ContextRank: "0", GenerationInstance: "gen-2", GenerationRank: "1", RequestID: "edge-1-7",
		ContextState: 12, GenerationState: 14, HasState: true, ContextOwnKey: true}
	if err != nil || r != want {
		t.Fatalf("%+v %v, want %+v", r, err, want)
	}
	for _, bad := range []string{"context", "prefill=a/1", "context=a/1; context_state=x", "context=a/1; context_key=parent"} {
		if _, err := ParseRoute(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
