package bench

import (
	"fmt"
	"strings"
	"time"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/routing/breaker"
	"github.com/tether-project/tether/routing/kvindex"
	"github.com/tether-project/tether/routing/overload"
)

// KVEventsMode is what the edges hear of the workers' caches.
type KVEventsMode string

// The --kv-events modes.
const (
	// KVEventsExact: every batch at the worker's next flush.
	KVEventsExact KVEventsMode = "exact"
	// KVEventsLag: every batch, Lag after the flush.
	KVEventsLag KVEventsMode = "lag"
	// KVEventsNone: no engine events (vLLM without --kv-events-config,
	// trtllm-serve unpolled): each edge knows its own predictions, what
	// the edges share by design and the engines' usage answers.
	KVEventsNone KVEventsMode = "none"
)

// KVEvents is the --kv-events condition.
type KVEvents struct {
	Mode KVEventsMode
	Lag  time.Duration
}

// ParseKVEvents parses --kv-events: exact, lag=DUR or none.
func ParseKVEvents(s string) (KVEvents, error) {
	switch {
	case s == "" || s == string(KVEventsExact):
		return KVEvents{Mode: KVEventsExact}, nil
	case s == string(KVEventsNone):
		return KVEvents{Mode: KVEventsNone}, nil
	case strings.HasPrefix(s, "lag="):
		d, err := time.ParseDuration(strings.TrimPrefix(s, "lag="))
		if err != nil || d <= 0 || d > time.Hour {
			return KVEvents{}, fmt.Errorf("bench: --kv-events: lag must be a duration in (0, 1h], got %q", strings.TrimPrefix(s, "lag="))
		}
		return KVEvents{Mode: KVEventsLag, Lag: d}, nil
	}
	return KVEvents{}, fmt.Errorf("bench: --kv-events: unknown value %q (allowed: exact, lag=DUR, none)", s)
}

func (k KVEvents) String() string {
	switch k.Mode {
	case KVEventsLag:
		return "lag=" + k.Lag.String()
	case "":
		return string(KVEventsExact)
	}
	return string(k.Mode)
}

func (k KVEvents) validate() error {
	switch k.Mode {
	case "", KVEventsExact, KVEventsNone:
		return nil
	case KVEventsLag:
		if k.Lag <= 0 {
			return fmt.Errorf("kv events lag must be > 0, got %v", k.Lag)
		}
		return nil
	}
	return fmt.Errorf("unknown kv events mode %q", k.Mode)
}

// span is the workload's scripted span: the latest root start plus its
// last top-level offset (scaled). Restarts are spread over it.
func (s *simulator) span() time.Duration {
	var end time.Duration
	for _, a := range s.w.Agents {
		last := time.Duration(0)
		if n := len(a.Steps); n > 0 {
			last = a.Steps[n-1].At
		}
		end = max(end, a.Start+s.scaled(last))
	}
	return end
}

// scheduleRestarts queues the EdgeRestarts restarts: the k-th (1-based) at
// k × span ÷ (N+1), of edge (k−1) mod Edges.
func (s *simulator) scheduleRestarts() {
	n := s.cfg.EdgeRestarts
	if n == 0 {
		return
	}
	sp := s.span()
	for k := 1; k <= n; k++ {
		at := time.Duration(float64(sp) * float64(k) / float64(n+1))
		s.push(&event{at: at, kind: evRestart, edge: (k - 1) % len(s.edges)})
	}
}

// restartEdge restarts edge i: it keeps only what its policy persists.
// Every policy loses the edge's memory (its pending dispatches, overload
// tracker, breakers, touch batch, in-flight proposals). Its KV index is
// rebuilt from the workers (a resync: every batch published so far) when
// the fleet publishes events; without events it starts empty. tether and
// session keep the shared log (a replica catches up from its peers);
// tether_local and session_local lose their binding tables; the peers keep
// what their documentation says they persist (peers.go).
func (s *simulator) restartEdge(i int) error {
	e := s.edges[i]
	s.res.Restarts++
	rc := s.router.Config()
	for k := range e.pending {
		e.pending[k] = nil
	}
	e.overload = overload.NewTracker()
	if e.breakers != nil {
		b, err := breaker.NewSet(rc.Breaker)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		e.breakers = b
	}
	e.touchKeys, e.touchLinks = nil, nil
	clear(e.touchPending)
	e.proposals = map[fsm.FleetKey]*simProposal{}
	if e.local != nil {
		e.local = newVirtualLog(1, CommitLatency{}, 0)
	}
	if e.index != nil {
		e.index = kvindex.New(kvindex.Config{PredictTTL: e.predictTTL})
		if e.shadow != nil {
			e.shadow = newShadow(e.index) // a new process: its shadows start empty
		}
		if err := s.resync(e); err != nil {
			return err
		}
	}
	if s.peer != nil {
		s.peer.restart(s, i)
	}
	e.dec = s.decider(e)
	return nil
}

// resync refills a restarted edge's fresh KV index: with events, every
// batch published so far (a dump of the workers' caches) — or, for a policy
// that does not resync (llm-d), nothing but the position of each instance's
// stream, so it fills from the next events on.
func (s *simulator) resync(e *simEdge) error {
	if s.cfg.KVEvents.Mode == KVEventsNone {
		return nil
	}
	if !s.peerKeepsIndex() {
		for id, seq := range e.heard {
			in := s.instances[s.byID[id]]
			if err := e.index.ReplaceInstance(id, 1, seq, make([][]uint64, len(in.ranks))); err != nil {
				return fmt.Errorf("bench: %s: restart: %w", e.id, err)
			}
		}
		return nil
	}
	for _, b := range s.kvLog {
		if out, err := e.index.Apply(b); err != nil || out != kvindex.Applied {
			return fmt.Errorf("bench: %s: resync batch %d of %s: outcome %v (err %v)", e.id, b.Seq, b.Instance, out, err)
		}
	}
	return nil
}
