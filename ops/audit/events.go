package audit

import (
	"time"

	"github.com/tether-project/tether/fsm"
)

// EvictedJSON is one binding an apply removed.
type EvictedJSON struct {
	Fleet    string `json:"fleet"`
	Key      string `json:"key"`
	Instance string `json:"instance"`
	Epoch    uint64 `json:"epoch"`
	Reason   string `json:"reason"`
}

// EffectsJSON is what applying a proposal did, as the archive recorded it.
type EffectsJSON struct {
	Status  string        `json:"status"`
	Reason  string        `json:"reason,omitempty"`
	Evicted []EvictedJSON `json:"evicted"`
}

func evictedJSON(ev []fsm.Evicted) []EvictedJSON {
	out := make([]EvictedJSON, len(ev))
	for i, e := range ev {
		out[i] = EvictedJSON{Fleet: e.Fleet.String(), Key: e.Key, Instance: e.Instance, Epoch: e.Epoch, Reason: e.Reason.String()}
	}
	return out
}

func logTime(ns int64) time.Time { return time.Unix(0, ns).UTC() }
