package routing

import (
	"testing"
	"time"

	"github.com/tether-project/tether/fsm"
)

// An adapter request prefers an instance holding the adapter, weighed
// against load like any cost; a full instance costs more than one with a
// free slot; base-model requests ignore adapters.
func TestAdapterCostInPlacement(t *testing.T) {
	r, err := NewRouter(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	place := func(adapter string, views ...InstanceView) string {
		t.Helper()
		vs, err := NewViews(views)
		if err != nil {
			t.Fatal(err)
		}
		rt, err := r.place(Request{Fleet: fsm.FleetContext, RequestID: "r", Adapter: adapter, Now: time.Unix(1, 0)}, Inputs{Views: vs})
		if err != nil {
			t.Fatal(err)
		}
		return rt.Instance
	}
	iv := func(id string, queued int64, lora *LoRAView) InstanceView {
		return InstanceView{ID: id, Fleet: fsm.FleetContext, Healthy: true, QueuedPrefillTokens: queued, LoRA: lora}
	}
	holds := &LoRAView{MaxLoRAs: 2, Loaded: []string{"agent-a"}}
	if got := place("agent-a", iv("a", 0, nil), iv("b", 0, holds)); got != "b" {
		t.Fatalf("idle fleet: %s, want the holder b", got)
	}
	if got := place("agent-a", iv("a", 0, nil), iv("b", 200, holds)); got != "b" {
		t.Fatalf("holder with 200 queued tokens (less than a load): %s, want b", got)
	}
	if got := place("agent-a", iv("a", 0, nil), iv("b", DefaultLoRALoad+100, holds)); got != "a" {
		t.Fatalf("holder with more queued than a load costs: %s, want a", got)
	}
	full := &LoRAView{MaxLoRAs: 1, Loaded: []string{"agent-x"}, Full: true}
	if got := place("agent-a", iv("a", 1000, &LoRAView{MaxLoRAs: 1}), iv("b", 0, full)); got != "a" {
		t.Fatalf("a full instance must cost a slot wait: %s", got)
	}
	if got := place("", iv("a", 10, nil), iv("b", 0, holds)); got != "b" {
		t.Fatalf("base request: %s, want the least loaded", got)
	}
}
