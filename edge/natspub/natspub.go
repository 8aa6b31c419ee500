// Package natspub sends an edge's own NATS messages (the dispatches and
// placements it tells the other edges) off the request path: a request
// queues its message and goes on; one goroutine publishes them in order.
// nats.go holds its connection's lock while its flusher writes to the
// socket, so a publish (even IsConnected) on a connection whose peer is
// gone waits for that write's timeout: without the queue, every request
// would wait with it. The queue is bounded; a message that finds it full
// is dropped and its sender told (the others then count without it, as
// they do while NATS is down).
package natspub

import (
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
)

// QueueSize bounds the messages waiting to be published: two per request
// (its dispatch and its end) and one per new key's placement, so seconds of
// an edge's traffic at its usual rates.
const QueueSize = 4096

// Publisher publishes queued messages on one connection, in the order they
// were queued.
type Publisher struct {
	conn *nats.Conn
	q    chan message

	started atomic.Bool
	stop    chan struct{}
	once    sync.Once
	done    chan struct{}
}

type message struct {
	subject string
	data    []byte
	result  func(sent bool)
}

// New is a publisher on conn (nil: every message is dropped) with room for
// size messages; Start publishes them.
func New(conn *nats.Conn, size int) *Publisher {
	return &Publisher{conn: conn, q: make(chan message, max(size, 1)), stop: make(chan struct{}), done: make(chan struct{})}
}

// Publish queues data for subject and returns at once. result (may be nil)
// is told once whether the message went out: false when the queue is full
// or the publisher stopped (at once, on the caller's goroutine), or when
// the connection is down or the publish fails (later, on the publisher's).
func (p *Publisher) Publish(subject string, data []byte, result func(sent bool)) {
	if p == nil || p.conn == nil {
		report(result, false)
		return
	}
	select {
	case <-p.stop:
		report(result, false)
		return
	default:
	}
	select {
	case p.q <- message{subject: subject, data: data, result: result}:
	default:
		report(result, false)
	}
}

// Start publishes the queued messages, on a goroutine of its own, until
// Close.
func (p *Publisher) Start() {
	if p.conn != nil && p.started.CompareAndSwap(false, true) {
		go p.run()
	}
}

func (p *Publisher) run() {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		case m := <-p.q:
			// While the connection is down nothing is buffered for a
			// reconnect: the others' counts would only be older by then.
			sent := p.conn.IsConnected() && p.conn.Publish(m.subject, m.data) == nil
			report(m.result, sent)
		}
	}
}

// Close stops the publishing (waiting for a publish under way) and drops
// what is still queued; later messages are dropped.
func (p *Publisher) Close() {
	if p == nil {
		return
	}
	p.once.Do(func() { close(p.stop) })
	if p.started.Load() {
		<-p.done
	}
}

func report(result func(bool), sent bool) {
	if result != nil {
		result(sent)
	}
}
