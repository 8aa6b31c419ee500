package oaiserve

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/tether-project/tether/internal/enginekv"
)

func requestOf(t *testing.T, body map[string]any) request {
	t.Helper()
	b, _ := json.Marshal(body)
	var r request
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// events collects what tether's subscriber and mapper make of a stream.
type events struct {
	mu        sync.Mutex
	m         *enginekv.Mapper
	st, rm    []uint64
	wasClosed bool
}

func (e *events) Batch(_ uint64, b enginekv.Batch) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range b.Events {
		if ev.Kind == enginekv.Cleared {
			e.wasClosed = true
		}
		s, r := e.m.Apply(ev)
		e.st, e.rm = append(e.st, s...), append(e.rm, r...)
	}
}

func (e *events) Reset(string) {}

func (e *events) stored() []uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]uint64(nil), e.st...)
}

func (e *events) removed() []uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]uint64(nil), e.rm...)
}

func (e *events) cleared() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.wasClosed
}

func subscribe(t *testing.T, endpoint, replay string, bs int) *events {
	t.Helper()
	sub, err := enginekv.NewSubscriber(enginekv.SubscriberConfig{Endpoint: endpoint, ReplayEndpoint: replay})
	if err != nil {
		t.Fatal(err)
	}
	e := &events{m: enginekv.NewMapper(bs, 0)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sub.Run(ctx, e) }()
	t.Cleanup(func() { cancel(); <-done })
	return e
}
