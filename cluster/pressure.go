package cluster

import (
	"sync"
	"time"
)

// proposePressure tracks how this node's recent proposals fared: how many
// took more than half of ProposeTimeout or failed for want of a commit in
// time. A log that commits slowly because its hosts are starved is the
// first thing a request-admission layer should listen to: the next
// placements will time out too.
type proposePressure struct {
	mu      sync.Mutex
	buckets [pressureBuckets]pressureBucket
}

const (
	pressureSpan    = 100 * time.Millisecond
	pressureBuckets = 10 // one second
)

type pressureBucket struct {
	slot      int64 // start time / pressureBucket
	total     int
	slowOrErr int
}

func (p *proposePressure) note(now time.Time, slow bool) {
	slot := now.UnixNano() / int64(pressureSpan)
	p.mu.Lock()
	defer p.mu.Unlock()
	b := &p.buckets[slot%pressureBuckets]
	if b.slot != slot {
		*b = pressureBucket{slot: slot}
	}
	b.total++
	if slow {
		b.slowOrErr++
	}
}

// ProposePressure reports this node's proposals over the last second: how
// many finished, and how many of them took more than half of
// ProposeTimeout or failed unavailable (the log did not commit them in
// time).
func (n *Node) ProposePressure(now time.Time) (total, slow int) {
	p := &n.pressure
	slot := now.UnixNano() / int64(pressureSpan)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.buckets {
		if b.slot > slot-pressureBuckets && b.slot <= slot {
			total += b.total
			slow += b.slowOrErr
		}
	}
	return total, slow
}
