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
func Options() []goleak.Option {
	return []goleak.Option{goleak.IgnoreAnyFunction("github.com/tether-project/tether/cluster.waitFuture.func1")}
}

// VerifyTestMain runs the tests, then fails the package if goroutines other
// than those Options ignores are left running.
func VerifyTestMain(m *testing.M) { goleak.VerifyTestMain(m, Options()...) }

// Find reports goroutines left running, other than those Options ignores.
func Find() error { return goleak.Find(Options()...) }
