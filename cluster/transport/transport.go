// Package transport is a cluster node's network: one TCP port per node,
// optionally TLS (mutual, with node identities in the certificates),
// multiplexing Raft's streams and the forwarding RPC behind an HMAC
// challenge-response handshake on the cluster's AuthKey; the forwarding
// client and server with their frame and payload codecs. It knows nothing
// of Raft's state or of proposals beyond their wire form: the node package
// (cluster) hands it a Handler and uses its Client and its raft.StreamLayer.
// See DESIGN.md here and in cluster/.
package transport

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"

	"github.com/hashicorp/raft"
)

// Config is how a node's transport listens, dials and authenticates.
type Config struct {
	// Listener is the node's port (the transport closes it).
	Listener net.Listener
	// Advertise is the address peers dial (raft.StreamLayer's Addr).
	Advertise string
	// TLS, when set, wraps every connection, Raft included.
	TLS *tls.Config
	// Dial opens raw connections (nil: a net.Dialer).
	Dial DialFunc
	// AuthKey is the cluster's shared key for the handshake.
	AuthKey []byte
	// SelfID is this node's id, claimed in handshakes.
	SelfID string
	// MemberAt is the node id expected at a dialed address, whose TLS
	// certificate must name it ("" when unknown: no name check). Nil: never
	// known.
	MemberAt func(addr string) string
	// OnAuthFailure, when set, is told of every refused handshake (Raft or
	// forwarding).
	OnAuthFailure func(remote net.Addr, err error)
	Logger        *slog.Logger
}

// Transport is one node's port: its mux, its forwarding client and, once
// Serve ran, its forwarding server.
type Transport struct {
	cfg    Config
	mux    *mux
	client *Client
}

// New sets up the transport on cfg.Listener; nothing is accepted until
// Serve. Close releases it (and the listener) in any case.
func New(cfg Config) *Transport {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	t := &Transport{cfg: cfg}
	t.mux = newMux(cfg.Listener, cfg.Advertise, cfg.TLS, cfg.Dial, muxAuth{
		key: cfg.AuthKey, selfID: cfg.SelfID, idForAddr: cfg.MemberAt, onFailure: cfg.OnAuthFailure,
	}, cfg.Logger)
	t.client = NewClient(cfg.SelfID, cfg.AuthKey, func(ctx context.Context, addr string) (net.Conn, error) {
		return t.mux.dialStream(ctx, addr, StreamForward, t.mux.expectedID(addr))
	})
	return t
}

// Serve starts accepting: Raft streams go to StreamLayer, forwarding
// connections to a server running h. ctx is the node's lifetime: when it
// ends, forwarding connections close and running handlers are cancelled.
func (t *Transport) Serve(ctx context.Context, h Handler) {
	server := &forwardServer{
		key:           t.cfg.AuthKey,
		h:             h,
		ctx:           ctx,
		log:           t.cfg.Logger,
		onAuthFailure: t.cfg.OnAuthFailure,
	}
	t.mux.start(server.serve)
}

// StreamLayer is the raft.StreamLayer for raft.NetworkTransport:
// authenticated Raft streams in and out of this port. Its Close only stops
// handing streams to Raft; the port stays open for forwarding.
func (t *Transport) StreamLayer() raft.StreamLayer { return raftStream{m: t.mux} }

// Client is the forwarding client dialing peers through this port.
func (t *Transport) Client() *Client { return t.client }

// CloseConns closes the listener and every connection accepted or dialed,
// at once (a crash-like stop; Close after it is still needed).
func (t *Transport) CloseConns() { t.mux.close() }

// WaitRaftHandlers waits, after Close and the Raft transport's own Close,
// until Raft's handlers of accepted connections have returned, or ctx
// ends (false): until then one may still write to the stores.
func (t *Transport) WaitRaftHandlers(ctx context.Context) bool { return t.mux.waitRaftHandlers(ctx) }

// Close closes the forwarding client, then the listener and every
// connection. Idempotent.
func (t *Transport) Close() {
	t.client.Close()
	t.mux.close()
}
