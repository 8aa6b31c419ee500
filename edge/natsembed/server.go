package natsembed

import (
	"fmt"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
)

// RandomPort asks the server for a free port.
const RandomPort = natsserver.RANDOM_PORT

// readyTimeout bounds how long Start waits for the server to accept
// connections (a port in use fails at once; this covers a slow machine).
const readyTimeout = 10 * time.Second

// Start starts a server with opts and waits until it accepts connections.
// Logging and signal handling stay off: the process that embeds it owns
// both.
func Start(opts *natsserver.Options) (*natsserver.Server, error) {
	opts.NoLog, opts.NoSigs = true, true
	srv, err := natsserver.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(readyTimeout) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("nats on %s:%d did not become ready (port in use?)", opts.Host, opts.Port)
	}
	return srv, nil
}
