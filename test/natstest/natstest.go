// Package natstest runs the embedded NATS server for tests: real NATS, in
// process, on a free loopback port, stopped when the test ends.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Start runs a NATS server with opts (nil: defaults) and shuts it down when
// the test ends. Host defaults to 127.0.0.1 and Port 0 to a free port;
// logging and signal handling are always off.
func Start(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	o := server.Options{}
	if opts != nil {
		o = *opts
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.Port == 0 {
		o.Port = server.RANDOM_PORT
	}
	o.NoLog, o.NoSigs = true, true
	ns, err := server.NewServer(&o)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}
