package telemetry

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestFlowStateRoundTripAndRejects(t *testing.T) {
	s := FlowState{Edge: "edge-1", Seq: 9, Models: []FlowModel{{Model: "m", Flows: []FlowEntry{
		{Tenant: "acme", Band: FlowBandInter, Queued: 3, Served: 4096.5, Rate: 1.25, LastMilli: 1500},
		{Tenant: "key-0123456789abcdef", Band: FlowBandBatch, Served: 12},
	}}}}
	data, err := EncodeFlowState(s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeFlowState(FlowSubject("edge-1"), data)
	s.V = Version
	if err != nil || !reflect.DeepEqual(got, s) {
		t.Fatalf("round trip = %+v, %v; want %+v", got, err, s)
	}
	if _, err := EncodeFlowState(FlowState{Edge: "edge.1"}); err == nil {
		t.Fatal("an edge id a subject cannot carry was encoded")
	}
	flow := func(f string) string {
		return `{"v":1,"edge":"edge-1","seq":1,"models":[{"model":"m","flows":[` + f + `]}]}`
	}
	many := strings.Repeat(`{"tenant":"t","band":"batch","queued":0,"served":0,"rate":0},`, MaxFlowEntries)
	bad := []struct {
		name, subject, data string
		kind                error
	}{
		{"another edge's subject", FlowSubject("edge-2"), string(data), ErrSubjectMismatch},
		{"version", FlowSubject("edge-1"), `{"v":9}`, ErrUnknownVersion},
		{"empty tenant", FlowSubject("edge-1"), flow(`{"tenant":"","band":"batch"}`), ErrOutOfRange},
		{"tenant with a space", FlowSubject("edge-1"), flow(`{"tenant":"a b","band":"batch"}`), ErrOutOfRange},
		{"band", FlowSubject("edge-1"), flow(`{"tenant":"a","band":"urgent"}`), ErrOutOfRange},
		{"negative queued", FlowSubject("edge-1"), flow(`{"tenant":"a","band":"batch","queued":-1}`), ErrOutOfRange},
		{"negative served", FlowSubject("edge-1"), flow(`{"tenant":"a","band":"batch","served":-1}`), ErrOutOfRange},
		{"huge rate", FlowSubject("edge-1"), flow(`{"tenant":"a","band":"batch","rate":1e300}`), ErrOutOfRange},
		{"negative last_ms", FlowSubject("edge-1"), flow(`{"tenant":"a","band":"batch","last_ms":-1}`), ErrOutOfRange},
		{"too many flows", FlowSubject("edge-1"), flow(many + `{"tenant":"t","band":"batch"}`), ErrOutOfRange},
		{"no model", FlowSubject("edge-1"), `{"v":1,"edge":"edge-1","models":[{"model":"","flows":[]}]}`, ErrOutOfRange},
		{"malformed", FlowSubject("edge-1"), `{"v":1,"edge":7}`, ErrMalformed},
		{"a dispatch's subject", DispatchSubject("edge-1"), string(data), ErrBadSubject},
	}
	for _, c := range bad {
		if _, err := DecodeFlowState(c.subject, []byte(c.data)); !errors.Is(err, c.kind) {
			t.Errorf("%s: DecodeFlowState = %v, want %v", c.name, err, c.kind)
		}
	}
}
