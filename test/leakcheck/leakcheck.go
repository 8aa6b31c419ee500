// Package leakcheck is goleak configured for tests that run cluster nodes in
// process.
package leakcheck

import (
	"testing"

	"go.uber.org/goleak"
)

// Options ignores the one goroutine a closed node may knowingly leave: a
// cluster.waitFuture whose context ended while raft still held the future,
// when raft then dropped it at shutdown. hashicorp/raft resolves most futures
// only from its run loops and does not drain them when it stops (a barrier
// committed but still queued for the FSM, for one), so the goroutine waiting on
// such a future never returns. It is one goroutine per dropped future, and
// futures are only dropped by a node that is shutting down.
//
// It also ignores go-zeromq/zmq4's PUB writer: a PUB socket's Close never
// stops the goroutine that waits for messages to send (zmq4 v0.17.0), one
// per closed publisher; only simulated engines publishing vLLM-format KV
// events (worker/kvevents.Publisher) open PUB sockets.
func Options() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/tether-project/tether/cluster.waitFuture.func1"),
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
	}
}

// VerifyTestMain runs the tests, then fails the package if goroutines other
// than those Options ignores are left running.
func VerifyTestMain(m *testing.M) { goleak.VerifyTestMain(m, Options()...) }

// Find reports goroutines left running, other than those Options ignores.
func Find() error { return goleak.Find(Options()...) }
