package bench

import (
	"github.com/tether-project/tether/edge/kvshadow"
	"github.com/tether-project/tether/routing/kvindex"
)

// A tether edge in front of engines that publish no KV events models each
// one's prefix cache from the prompts it routes there (edge/kvshadow) and
// corrects the model by each response's cached tokens (edge/dispatch
// shadow.go). With --kv-events none the simulated tether edges do the
// same. With Share.Shadows (an ablation: the shipped edges keep their
// shadows their own) each edge also hears the others' routes ShareLatency
// later.

// shadowFirstBoot numbers the shadows' boots above the simulated workers'
// own (1), as the edge keeps its shadows' boots apart from the engines'.
const shadowFirstBoot = 1 << 32

// usesShadow reports whether the simulated edges keep shadow caches.
func (s *simulator) usesShadow() bool {
	return s.cfg.KVEvents.Mode == KVEventsNone && s.cfg.Policy.isTether()
}

// newShadow returns an empty set of shadows feeding ix.
func newShadow(ix *kvindex.Index) *kvshadow.Shadows { return kvshadow.New(ix, shadowFirstBoot) }

// shadowRoute models blocks sent to instIdx's rank in edge's shadow and,
// when shared, queues the route for the other edges. It returns the
// placement for the response's correction (nil: not modelled).
func (s *simulator) shadowRoute(edge, instIdx, rank int, blocks []uint64) *kvshadow.Placement {
	e := s.edges[edge]
	if e.shadow == nil {
		return nil
	}
	p, ok := s.shadowApply(e, instIdx, rank, blocks)
	if s.cfg.Share.Shadows {
		for j := range s.edges {
			if j != edge {
				s.push(&event{at: s.now + s.cfg.ShareLatency, kind: evShadowHear, edge: j, inst: instIdx, rank: rank, blocks: blocks})
			}
		}
	}
	if !ok {
		return nil
	}
	return &p
}

// hearShadow applies another edge's route to edge's shadow.
func (s *simulator) hearShadow(edge, instIdx, rank int, blocks []uint64) {
	if e := s.edges[edge]; e.shadow != nil {
		s.shadowApply(e, instIdx, rank, blocks)
	}
}

func (s *simulator) shadowApply(e *simEdge, instIdx, rank int, blocks []uint64) (kvshadow.Placement, bool) {
	in := s.instances[instIdx]
	p, ok, err := e.shadow.Route(in.id, rank, len(in.ranks), in.rankCap, blocks)
	if err != nil {
		s.fail(err)
	}
	return p, ok && err == nil
}

// shadowCorrect applies fl's cached tokens to the shadow that modelled it,
// unless the edge restarted since (a new process corrects nothing).
func (s *simulator) shadowCorrect(fl *inflight) {
	e := s.edges[fl.edge]
	if fl.shadow == nil || e.shadow != fl.shadowOf || s.w.BlockSize <= 0 {
		return
	}
	if err := e.shadow.Correct(*fl.shadow, fl.blocks, fl.cached/s.w.BlockSize); err != nil {
		s.fail(err)
	}
}
