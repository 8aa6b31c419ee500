package main

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/tether-project/tether/ops/devstack"
)

// --model takes several names of one model (the first its name, as vLLM's
// --served-model-name); --models replaces it, one name per model.
func TestDevModelFlags(t *testing.T) {
	for _, tc := range []struct {
		model, models string
		names, extra  []string
	}{
		{"tether-sim,gpt-5.6-luna", "", []string{"tether-sim", "gpt-5.6-luna"}, nil},
		{"m", "", []string{"m"}, nil},
		{" a , b ,", "", []string{"a", "b"}, nil},
		{"tether-sim,gpt-5.6-luna", "x,y", []string{"x"}, []string{"y"}},
	} {
		names, extra, err := devModels(tc.model, tc.models)
		if err != nil || !slices.Equal(names, tc.names) || !slices.Equal(extra, tc.extra) {
			t.Errorf("--model %q --models %q: %v %v %v", tc.model, tc.models, names, extra, err)
		}
	}
	for _, bad := range [][2]string{{"", ""}, {",", ""}, {"m", ","}} {
		if _, _, err := devModels(bad[0], bad[1]); !errors.Is(err, errUsage) {
			t.Errorf("--model %q --models %q: %v, want a usage error", bad[0], bad[1], err)
		}
	}
}

// The banner's note on the admin token says where it came from: a given
// token is not stored, a temporary data dir does not outlive the run.
func TestAdminTokenNote(t *testing.T) {
	for _, c := range []struct {
		source string
		temp   bool
		want   string
	}{
		{"given", false, "not stored"},
		{"given", true, "not stored"},
		{"generated", true, "for this run"},
		{"generated", false, "kept in the data dir for the next start"},
		{"kept", false, "kept in the data dir from an earlier run"},
	} {
		if got := adminTokenNote(c.source, c.temp); !strings.Contains(got, c.want) {
			t.Errorf("source %s, temporary dir %v: %q, want it to say %q", c.source, c.temp, got, c.want)
		}
	}
}

// The banner's first line names the topology each flag combination gives.
func TestDevTopologyLine(t *testing.T) {
	for _, c := range []struct {
		o    devstack.Options
		want string
	}{
		{devstack.Options{ContextWorkers: 2, GenerationWorkers: 2, Ranks: 4}, "2 context + 2 generation workers (4 ADP ranks each)"},
		{devstack.Options{ContextWorkers: 2, Ranks: 1, Aggregated: true}, "2 aggregated workers serving whole requests (1 ADP rank each)"},
		{devstack.Options{ContextWorkers: 1, Ranks: 2, Aggregated: true, EngineEvents: devstack.EngineEventsVLLM},
			"1 aggregated worker serving whole requests (2 ADP ranks each; proxies in front of simulated engines publishing vllm KV events)"},
	} {
		if got := topology(c.o); got != c.want {
			t.Errorf("%+v: %q, want %q", c.o, got, c.want)
		}
	}
}
