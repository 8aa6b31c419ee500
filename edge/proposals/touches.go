package proposals

import (
	"context"
	"sync"
	"time"

	"github.com/tether-project/tether/fsm"
)

// Touches collects the bound keys (and parent links) requests used since
// the last flush; every touch_interval they become one Touch event.
type Touches struct {
	e     *env
	mu    sync.Mutex
	keys  map[fsm.FleetKey]struct{}
	links map[string]struct{}
	// proposing counts the keys and links of the batch taken for a
	// proposal that has not returned yet.
	proposing int
}

func newTouches(e *env) *Touches {
	return &Touches{e: e, keys: map[fsm.FleetKey]struct{}{}, links: map[string]struct{}{}}
}

// Add queues a bound key's use for the next Touch.
func (t *Touches) Add(k fsm.FleetKey) {
	t.mu.Lock()
	t.keys[k] = struct{}{}
	t.mu.Unlock()
}

// AddLink queues a used parent link (by its child) for the next Touch.
func (t *Touches) AddLink(child string) {
	t.mu.Lock()
	t.links[child] = struct{}{}
	t.mu.Unlock()
}

// take empties the batch.
func (t *Touches) take() fsm.Touch {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ev fsm.Touch
	if len(t.keys) == 0 && len(t.links) == 0 {
		return ev
	}
	ev.Keys = make([]fsm.FleetKey, 0, len(t.keys))
	for k := range t.keys {
		ev.Keys = append(ev.Keys, k)
	}
	ev.Links = make([]string, 0, len(t.links))
	for l := range t.links {
		ev.Links = append(ev.Links, l)
	}
	clear(t.keys)
	clear(t.links)
	t.proposing += len(ev.Keys) + len(ev.Links)
	return ev
}

// proposed ends the proposal of a batch take returned (after putBack when
// it failed).
func (t *Touches) proposed(ev fsm.Touch) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.proposing -= len(ev.Keys) + len(ev.Links)
}

// Pending is how many used keys and links are not yet in the log: waiting
// for the next flush, or in a proposal.
func (t *Touches) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.keys) + len(t.links) + t.proposing
}

// putBack merges an unflushed batch back.
func (t *Touches) putBack(ev fsm.Touch) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range ev.Keys {
		t.keys[k] = struct{}{}
	}
	for _, l := range ev.Links {
		t.links[l] = struct{}{}
	}
}

// maxTouchKeys bounds one Touch event; larger batches are split.
const maxTouchKeys = 8192

// answersInterval is the longest the engines' answers wait for the log
// when touch_interval is longer.
const answersInterval = time.Second

// Run flushes the used keys every touch_interval until ctx is done, and
// hands the recorder the engines' answers at least every answersInterval.
func (t *Touches) Run(ctx context.Context) {
	every := min(t.e.cfg.TouchInterval, answersInterval)
	tick := time.NewTicker(every)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if time.Since(last) < t.e.cfg.TouchInterval-every/2 {
			t.e.recorder.flushAnswers()
			continue
		}
		last = time.Now()
		fctx, cancel := context.WithTimeout(ctx, max(t.e.cfg.TouchInterval, time.Second))
		t.Flush(fctx)
		cancel()
	}
}

// Flush proposes the used keys as one Touch (split when huge). It also
// hands the recorder the engines' answers gathered since the last flush
// (one CacheAnswers event: answers.go).
func (t *Touches) Flush(ctx context.Context) {
	t.e.recorder.flushAnswers()
	ev := t.take()
	if len(ev.Keys) == 0 && len(ev.Links) == 0 {
		return
	}
	defer t.proposed(ev)
	var evs []fsm.Event
	for len(ev.Keys) > maxTouchKeys || len(ev.Links) > maxTouchKeys {
		part := fsm.Touch{Keys: ev.Keys[:min(len(ev.Keys), maxTouchKeys)], Links: ev.Links[:min(len(ev.Links), maxTouchKeys)]}
		ev.Keys, ev.Links = ev.Keys[len(part.Keys):], ev.Links[len(part.Links):]
		evs = append(evs, part)
	}
	evs = append(evs, ev)
	start := time.Now()
	_, err := t.e.edge.Node().ProposeBatch(ctx, evs)
	t.e.proposer.Observe(fsm.TypeTouch, fsm.Result{Status: fsm.StatusApplied}, err, time.Since(start))
	if err != nil {
		for _, x := range evs {
			t.putBack(x.(fsm.Touch))
		}
		return
	}
	t.e.metrics.Touches.Add(float64(len(evs)))
}
