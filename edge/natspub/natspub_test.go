package natspub

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/test/natstest"
)

// On a connection whose peer is gone (the socket open, nothing passing),
// nats.go's writes block with its connection's lock held; Publish still
// returns at once, the messages that find the queue full are dropped and
// said so, and once the peer is back the queued ones go out, in order.
func TestPublishNeverWaitsOnAStalledConnection(t *testing.T) {
	ns := natstest.Start(t, nil)
	proxy := natstest.NewStallProxy(t, ns.Addr().String())
	conn, err := nats.Connect("nats://"+proxy.Addr(), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sub, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	got := make(chan []byte, 64)
	if _, err := sub.Subscribe("natspub.test", func(m *nats.Msg) { got <- m.Data }); err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}

	p := New(conn, 8)
	p.Start()
	defer p.Close()
	proxy.Stall()
	// Fill the socket's buffers: a writer of the connection then blocks
	// holding its lock (what a request waited on).
	filler := make(chan struct{})
	go func() {
		defer close(filler)
		big := bytes.Repeat([]byte("x"), 512<<10)
		for range 128 {
			if conn.Publish("natspub.fill", big) != nil {
				return
			}
		}
	}()
	blocked := func() bool {
		done := make(chan struct{})
		go func() { conn.IsConnected(); close(done) }()
		select {
		case <-done:
			return false
		case <-time.After(200 * time.Millisecond):
			return true
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for !blocked() {
		if time.Now().After(deadline) {
			t.Fatal("the stalled connection's lock was never held: the test cannot show anything")
		}
	}

	var sent, dropped atomic.Int64
	result := func(ok bool) {
		if ok {
			sent.Add(1)
		} else {
			dropped.Add(1)
		}
	}
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		for i := range 40 {
			p.Publish("natspub.test", []byte{byte(i)}, result)
		}
	}()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("Publish waited on the stalled connection")
	}
	// One message may be in the publisher's hands, 8 queued: the rest dropped.
	if n := dropped.Load(); n < 40-9 {
		t.Fatalf("%d of 40 messages dropped with the queue of 8 full, want at least %d", n, 40-9)
	}

	proxy.Resume()
	waitFor(t, func() bool { return sent.Load()+dropped.Load() == 40 })
	<-filler
	var order []byte
	timeout := time.After(10 * time.Second)
	for int64(len(order)) < sent.Load() {
		select {
		case b := <-got:
			order = append(order, b...)
		case <-timeout:
			t.Fatalf("%d messages sent, %d arrived", sent.Load(), len(order))
		}
	}
	for i := 1; i < len(order); i++ {
		if order[i] <= order[i-1] {
			t.Fatalf("messages out of order: %v", order)
		}
	}
}

// A publisher without a connection, or closed, drops every message at once.
func TestPublishWithoutConnectionDrops(t *testing.T) {
	for _, p := range []*Publisher{New(nil, 4), nil, func() *Publisher { p := New(&nats.Conn{}, 4); p.Close(); return p }()} {
		var result []bool
		p.Publish("s", []byte("x"), func(ok bool) { result = append(result, ok) })
		if len(result) != 1 || result[0] {
			t.Fatalf("results %v, want one false", result)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
