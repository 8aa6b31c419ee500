package audit

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
)

// exportSamples holds one event of every type the fsm knows; a type added
// to the fsm without a sample here fails TestExportDecodesEveryEventType.
var exportSamples = []fsm.Event{
	fsm.Bind{Fleet: fsm.FleetContext, Key: "k", ConversationID: "k", Instance: "ctx-1",
		Decision: fsm.Decision{Edge: "edge-1", Policy: "kv_aware", RequestID: "r", Candidates: []fsm.Candidate{{Instance: "ctx-1", Score: 1, CachedTokens: 256, LoadTokens: 10}}}},
	fsm.Touch{Keys: []fsm.FleetKey{{Fleet: fsm.FleetContext, Key: "k"}}, Links: []string{"c"}},
	fsm.Evict{Fleet: fsm.FleetContext, Key: "k", Reason: fsm.EvictTTL, Epoch: 7},
	fsm.Overflow{Fleet: fsm.FleetContext, Key: "k", From: "ctx-1", To: "ctx-2", Reason: fsm.OverflowUnhealthy, Rebind: true},
	fsm.InstanceState{Instance: "ctx-1", Fleet: fsm.FleetContext, URL: "http://x", Status: fsm.InstanceUp, Version: "v", FeatureLevel: 2, Ranks: 4},
	fsm.InstanceDrain{Instance: "ctx-1", Drain: true, Source: "admin via edge-1"},
	fsm.ClusterFeatures{Level: 2},
	fsm.Link{Child: "c", Parent: "k", Root: "k", Depth: 1},
	fsm.NodeInfo{NodeID: "edge-1", Version: "v", MaxFeatureLevel: 2},
	fsm.Settings{MaxBindings: 10},
	fsm.RankObserved{Fleet: fsm.FleetContext, Key: "k", Epoch: 7, Rank: 3},
	fsm.Annotation{Source: "operator", Text: "note"},
	fsm.Evidence{Fleet: fsm.FleetContext, Key: "k", RequestID: "r", Rule: "kv_aware", Candidates: []fsm.EvidenceCandidate{{Instance: "ctx-1", CachedBlocks: 4, Flags: fsm.EvidenceChosen}}},
	fsm.CacheAnswers{Edge: "edge-1", Answers: []fsm.CacheAnswer{{Fleet: fsm.FleetContext, Instance: "ctx-1", ConversationID: "k", Source: fsm.KVSourceTetherWorker,
		AtUnixMilli: 1, BlockSize: 64, PromptTokens: 300, PredictedTokens: 256, CachedTokens: 256, Blocks: 4, Prefix: []uint32{1, 2, 3, 4}}}},
}

// Every event type of the fsm's table exports with its fields decoded, not
// as type_byte and raw_hex. The table is every type byte whose name the fsm
// knows.
func TestExportDecodesEveryEventType(t *testing.T) {
	byType := map[fsm.EventType]fsm.Event{}
	for _, ev := range exportSamples {
		byType[ev.Type()] = ev
	}
	var known []fsm.EventType
	for b := range 256 {
		typ := fsm.EventType(b)
		if !strings.HasPrefix(typ.String(), "EventType(") {
			known = append(known, typ)
		}
	}
	if len(known) < 11 {
		t.Fatalf("only %d known event types found", len(known))
	}
	for _, typ := range known {
		ev, ok := byType[typ]
		if !ok {
			t.Errorf("event type %s (0x%02x) has no sample here: add one (its description is its row in fsm/kinds.go)", typ, uint8(typ))
			continue
		}
		data, err := fsm.EncodeEntry([]fsm.Proposal{{Event: ev}})
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		evs := recordEvents(archive.Record{Index: 5, Time: 1, Data: data})
		if len(evs) != 1 {
			t.Fatalf("%s: %d exported events", typ, len(evs))
		}
		if evs[0].Type != typ.String() || evs[0].Error != "" {
			t.Errorf("%s: exported as %q (error %q)", typ, evs[0].Type, evs[0].Error)
		}
		var line bytes.Buffer
		if err := json.NewEncoder(&line).Encode(evs[0]); err != nil {
			t.Fatal(err)
		}
		var back struct {
			Fields map[string]any `json:"fields"`
		}
		if err := json.Unmarshal(line.Bytes(), &back); err != nil {
			t.Fatal(err)
		}
		if _, raw := back.Fields["raw_hex"]; raw || len(back.Fields) == 0 {
			t.Errorf("%s: fields not decoded: %s", typ, line.Bytes())
		}
	}
}
