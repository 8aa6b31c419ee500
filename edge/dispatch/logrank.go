package dispatch

import (
	"net/http"
	"strconv"

	"github.com/tether-project/tether/edge/route"
)

// HeaderLogRank tells a worker the ADP rank the affinity log records for the
// hop's key (worker.HeaderLogRank): a restarted worker binds the
// conversation there again instead of placing it anew.
const HeaderLogRank = "x-tether-log-rank"

// setLogRank adds HeaderLogRank to a hop that follows its key's binding to
// the bound instance, when the log records the placement's rank.
func setLogRank(hdr http.Header, h *route.Hop) {
	if b := &h.Binding; h.Bound && b.HasRank && b.Instance == h.Instance && b.Key == h.Key {
		hdr.Set(HeaderLogRank, strconv.FormatUint(uint64(b.Rank), 10))
	}
}
