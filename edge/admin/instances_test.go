package admin

import (
	"reflect"
	"testing"

	"github.com/tether-project/tether/edge/fleetview"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/routing/kvindex"
)

// Where an instance's KV knowledge comes from, as /admin/v1/instances
// names it: the index's own flag (a shadow) first, then what the worker
// says its events reflect.
func TestKVInfoSources(t *testing.T) {
	worker := fleetview.Instance{Telemetry: true}
	proxyEvents := fleetview.Instance{Telemetry: true, KVSource: telemetry.KVSourceEngineEvents}
	proxyBlind := fleetview.Instance{Telemetry: true, KVSource: telemetry.KVSourceNone}
	static := fleetview.Instance{Static: true}
	exact := kvindex.InstanceKV{Synced: true, Boot: 9, Seq: 42, RankBlocks: []int64{3, 0, 5}}
	shadow := kvindex.InstanceKV{Synced: true, Approximate: true, Boot: 1, Seq: 7, RankBlocks: []int64{4}}
	for _, c := range []struct {
		name  string
		kv    kvindex.InstanceKV
		known bool
		in    fleetview.Instance
		want  InstanceKV
	}{
		{"sim worker", exact, true, worker, InstanceKV{Source: KVSourceTetherWorker, Blocks: 8, LastSeq: 42,
			Ranks: []RankKV{{0, 3}, {1, 0}, {2, 5}}}},
		{"proxy with engine events", exact, true, proxyEvents, InstanceKV{Source: KVSourceEngineEvents, Blocks: 8, LastSeq: 42,
			Ranks: []RankKV{{0, 3}, {1, 0}, {2, 5}}}},
		{"proxy without events", kvindex.InstanceKV{}, false, proxyBlind, InstanceKV{Source: KVSourcePredictionsOnly, Ranks: []RankKV{}}},
		{"static engine, shadowed", shadow, true, static, InstanceKV{Source: KVSourceShadow, Approximate: true, Blocks: 4, LastSeq: 7,
			Ranks: []RankKV{{0, 4}}}},
		{"static engine, nothing routed yet", kvindex.InstanceKV{}, false, static, InstanceKV{Source: KVSourcePredictionsOnly, Ranks: []RankKV{}}},
		{"worker not reporting yet", kvindex.InstanceKV{}, false, fleetview.Instance{}, InstanceKV{Source: KVSourcePredictionsOnly, Ranks: []RankKV{}}},
	} {
		if got := kvInfo(c.kv, c.known, c.in); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
