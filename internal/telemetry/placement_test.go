package telemetry

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestPlacementRoundTripAndRejects(t *testing.T) {
	p := Placement{Edge: "edge-1", Fleet: FleetContext, Key: "conv-1", ConversationID: "conv-1", Instance: "ctx-0", RequestID: "edge-1-7"}
	data, err := EncodePlacement(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodePlacement(PlacementSubject("edge-1"), data)
	p.V = Version
	if err != nil || !reflect.DeepEqual(got, p) {
		t.Fatalf("round trip = %+v, %v; want %+v", got, err, p)
	}
	if _, err := EncodePlacement(Placement{Edge: "edge.1", Fleet: FleetContext, Key: "k", Instance: "ctx-0"}); err == nil {
		t.Fatal("an edge id a subject cannot carry was encoded")
	}
	long := strings.Repeat("k", MaxStringLen+1)
	bad := []struct {
		name, subject, data string
		kind                error
	}{
		{"another edge's subject", PlacementSubject("edge-2"), string(data), ErrSubjectMismatch},
		{"version", PlacementSubject("edge-1"), `{"v":9}`, ErrUnknownVersion},
		{"fleet", PlacementSubject("edge-1"), `{"v":1,"edge":"edge-1","fleet":"x","key":"k","instance":"ctx-0"}`, ErrOutOfRange},
		{"empty key", PlacementSubject("edge-1"), `{"v":1,"edge":"edge-1","fleet":"context","key":"","instance":"ctx-0"}`, ErrOutOfRange},
		{"long key", PlacementSubject("edge-1"), `{"v":1,"edge":"edge-1","fleet":"context","key":"` + long + `","instance":"ctx-0"}`, ErrOutOfRange},
		{"instance", PlacementSubject("edge-1"), `{"v":1,"edge":"edge-1","fleet":"context","key":"k","instance":"a b"}`, ErrOutOfRange},
		{"malformed", PlacementSubject("edge-1"), `{"v":1,"edge":7}`, ErrMalformed},
		{"worker subject", KVSubject("edge-1"), string(data), ErrBadSubject},
	}
	for _, c := range bad {
		if _, err := DecodePlacement(c.subject, []byte(c.data)); !errors.Is(err, c.kind) {
			t.Errorf("%s: DecodePlacement = %v, want %v", c.name, err, c.kind)
		}
	}
}
