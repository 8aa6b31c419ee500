package telemetry

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestDispatchRoundTripAndRejects(t *testing.T) {
	d := Dispatch{Edge: "edge-1", ID: 7, Fleet: FleetGeneration, Instance: "gen-0", PromptTokens: 2048, Done: true,
		Work: "generation/conv-1", Blocks: 64}
	data, err := EncodeDispatch(d)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeDispatch(DispatchSubject("edge-1"), data)
	d.V = Version
	if err != nil || !reflect.DeepEqual(got, d) {
		t.Fatalf("round trip = %+v, %v; want %+v", got, err, d)
	}
	if _, err := EncodeDispatch(Dispatch{Edge: "edge.1", Fleet: FleetContext, Instance: "ctx-0"}); err == nil {
		t.Fatal("an edge id a subject cannot carry was encoded")
	}
	bad := []struct {
		name, subject, data string
		kind                error
	}{
		{"another edge's subject", DispatchSubject("edge-2"), string(data), ErrSubjectMismatch},
		{"version", DispatchSubject("edge-1"), `{"v":9}`, ErrUnknownVersion},
		{"fleet", DispatchSubject("edge-1"), `{"v":1,"edge":"edge-1","fleet":"x","instance":"ctx-0"}`, ErrOutOfRange},
		{"instance", DispatchSubject("edge-1"), `{"v":1,"edge":"edge-1","fleet":"context","instance":"a b"}`, ErrOutOfRange},
		{"negative tokens", DispatchSubject("edge-1"), `{"v":1,"edge":"edge-1","fleet":"context","instance":"ctx-0","prompt_tokens":-1}`, ErrOutOfRange},
		{"too many tokens", DispatchSubject("edge-1"), `{"v":1,"edge":"edge-1","fleet":"context","instance":"ctx-0","prompt_tokens":1073741825}`, ErrOutOfRange},
		{"negative blocks", DispatchSubject("edge-1"), `{"v":1,"edge":"edge-1","fleet":"context","instance":"ctx-0","blocks":-1}`, ErrOutOfRange},
		{"work too long", DispatchSubject("edge-1"), `{"v":1,"edge":"edge-1","fleet":"context","instance":"ctx-0","work":"` + strings.Repeat("k", MaxDispatchWorkBytes+1) + `"}`, ErrOutOfRange},
		{"malformed", DispatchSubject("edge-1"), `{"v":1,"edge":7}`, ErrMalformed},
		{"a placement's subject", PlacementSubject("edge-1"), string(data), ErrBadSubject},
	}
	for _, c := range bad {
		if _, err := DecodeDispatch(c.subject, []byte(c.data)); !errors.Is(err, c.kind) {
			t.Errorf("%s: DecodeDispatch = %v, want %v", c.name, err, c.kind)
		}
	}
}

func TestDispatchAnswer(t *testing.T) {
	d := Dispatch{Edge: "edge-1", Fleet: FleetContext, Instance: "ctx-0", PromptTokens: 900, Done: true,
		Answer: &DispatchAnswer{Source: "shadow", BlockSize: 16, PredictedTokens: 896, CachedTokens: 0}}
	roundTripDispatch(t, d)
	wantOutOfRange(t, map[string]string{
		"an answer with a dispatch id": `{"v":1,"edge":"edge-1","id":3,"done":true,"fleet":"context","instance":"ctx-0","answer":{"block_size":16}}`,
		"an answer not done":           `{"v":1,"edge":"edge-1","fleet":"context","instance":"ctx-0","answer":{"block_size":16}}`,
		"block size 0":                 `{"v":1,"edge":"edge-1","done":true,"fleet":"context","instance":"ctx-0","answer":{"block_size":0}}`,
		"negative cached":              `{"v":1,"edge":"edge-1","done":true,"fleet":"context","instance":"ctx-0","answer":{"block_size":16,"cached_tokens":-1}}`,
	})
}

func TestDispatchStrain(t *testing.T) {
	for _, over := range []bool{true, false} {
		roundTripDispatch(t, Dispatch{Edge: "edge-1", Fleet: FleetContext, Instance: "ctx-0", Done: true, Strain: &DispatchStrain{Overloaded: over}})
	}
	wantOutOfRange(t, map[string]string{
		"a strain with a dispatch id": `{"v":1,"edge":"edge-1","id":3,"done":true,"fleet":"context","instance":"ctx-0","strain":{"overloaded":true}}`,
		"a strain not done":           `{"v":1,"edge":"edge-1","fleet":"context","instance":"ctx-0","strain":{"overloaded":true}}`,
		"a strain with an answer":     `{"v":1,"edge":"edge-1","done":true,"fleet":"context","instance":"ctx-0","strain":{},"answer":{"block_size":16}}`,
	})
}

// roundTripDispatch encodes d and decodes it back unchanged.
func roundTripDispatch(t *testing.T, d Dispatch) {
	t.Helper()
	data, err := EncodeDispatch(d)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeDispatch(DispatchSubject("edge-1"), data)
	d.V = Version
	if err != nil || !reflect.DeepEqual(got, d) {
		t.Fatalf("round trip = %+v, %v; want %+v", got, err, d)
	}
}

// wantOutOfRange decodes each message and wants ErrOutOfRange.
func wantOutOfRange(t *testing.T, cases map[string]string) {
	t.Helper()
	for name, data := range cases {
		if _, err := DecodeDispatch(DispatchSubject("edge-1"), []byte(data)); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("%s: DecodeDispatch = %v, want ErrOutOfRange", name, err)
		}
	}
}
