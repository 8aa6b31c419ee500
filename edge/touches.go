package edge

import (
	"context"
	"sync"
	"time"

	"github.com/tether-project/tether/fsm"
)

// touchBatcher collects the bound keys (and parent links) requests used
// since the last flush; every touch_interval they become one Touch event.
type touchBatcher struct {
	mu    sync.Mutex
	keys  map[fsm.FleetKey]struct{}
	links map[string]struct{}
}

func newTouchBatcher() *touchBatcher {
	return &touchBatcher{keys: map[fsm.FleetKey]struct{}{}, links: map[string]struct{}{}}
}

func (t *touchBatcher) add(k fsm.FleetKey) {
	t.mu.Lock()
	t.keys[k] = struct{}{}
	t.mu.Unlock()
}

func (t *touchBatcher) addLink(child string) {
	t.mu.Lock()
	t.links[child] = struct{}{}
	t.mu.Unlock()
}

// take empties the batch.
func (t *touchBatcher) take() fsm.Touch {
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
	return ev
}

// putBack merges an unflushed batch back.
func (t *touchBatcher) putBack(ev fsm.Touch) {
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

func (e *Edge) touchLoop() {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.TouchInterval)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(e.ctx, max(e.cfg.TouchInterval, time.Second))
		e.flushTouches(ctx)
		cancel()
	}
}

// flushTouches proposes the used keys as one Touch (split when huge).
func (e *Edge) flushTouches(ctx context.Context) {
	ev := e.touches.take()
	if len(ev.Keys) == 0 && len(ev.Links) == 0 {
		return
	}
	var evs []fsm.Event
	for len(ev.Keys) > maxTouchKeys || len(ev.Links) > maxTouchKeys {
		part := fsm.Touch{Keys: ev.Keys[:min(len(ev.Keys), maxTouchKeys)], Links: ev.Links[:min(len(ev.Links), maxTouchKeys)]}
		ev.Keys, ev.Links = ev.Keys[len(part.Keys):], ev.Links[len(part.Links):]
		evs = append(evs, part)
	}
	evs = append(evs, ev)
	start := time.Now()
	_, err := e.node.ProposeBatch(ctx, evs)
	e.observeProposal(fsm.TypeTouch, fsm.Result{Status: fsm.StatusApplied}, err, time.Since(start))
	if err != nil {
		for _, x := range evs {
			e.touches.putBack(x.(fsm.Touch))
		}
		return
	}
	e.metrics.Touches.Add(float64(len(evs)))
}
