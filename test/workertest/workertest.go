// Package workertest starts the workers of a test and stops them when the
// test ends: a tether worker (*worker.Server), or any server started and
// closed the same way. It is generic over the server and imports no module
// package, so that the worker package's own tests use it too.
package workertest

import (
	"context"
	"testing"
	"time"
)

// Server is what Start needs of a worker. *worker.Server has it.
type Server interface {
	Start(ctx context.Context) error
	Close(ctx context.Context) error
}

// Timeout bounds a worker's start, and its close at the end of the test.
const Timeout = 10 * time.Second

// Start makes a worker from cfg with newServer (worker.New), starts it and
// closes it when the test ends; a worker that cannot be made or started,
// or that does not close cleanly, fails the test.
func Start[C any, S Server](t testing.TB, newServer func(C) (S, error), cfg C) S {
	t.Helper()
	s, err := newServer(cfg)
	if err != nil {
		t.Fatalf("workertest: new worker: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), Timeout)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("workertest: close worker: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatalf("workertest: start worker: %v", err)
	}
	return s
}
