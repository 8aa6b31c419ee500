package transport

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// Every inter-node connection starts (after TLS, when configured) with one
// byte naming the protocol that follows, so Raft and the forwarding RPC share
// one port.
const (
	StreamRaft    byte = 'R'
	StreamForward byte = 'F'
)

// muxHandshakeTimeout bounds TLS handshake plus the protocol byte (and, for
// Raft, the authentication handshake) on an accepted connection, so a silent
// client cannot hold a goroutine forever.
const muxHandshakeTimeout = 5 * time.Second

// muxAuth is what the mux needs to authenticate Raft streams with the
// challenge-response handshake forwarding uses (protoRaft labels), and to
// check TLS peer identities.
type muxAuth struct {
	key    []byte
	selfID string
	// idForAddr is the node id expected at a dialed address ("" when
	// unknown: no certificate name check for that dial).
	idForAddr func(addr string) string
	// onFailure counts refused handshakes.
	onFailure func(remote net.Addr, err error)
}

// DialFunc opens a connection to addr (a raw TCP-like one for Config.Dial;
// one that already sent StreamForward for NewClient).
type DialFunc func(ctx context.Context, addr string) (net.Conn, error)

// mux owns the node's listener and every connection accepted or dialed on
// it. Accepted connections are routed by their first byte: Raft streams to
// the raft.StreamLayer, forwarding connections to the forwarding server.
// Close closes the listener and all tracked connections, which is what ends
// hashicorp/raft's per-connection reader goroutines.
type mux struct {
	ln        net.Listener
	advertise string
	tls       *tls.Config
	dial      DialFunc
	auth      muxAuth
	log       *slog.Logger
	forward   func(net.Conn) // serves one authenticated-to-be forwarding connection; returns when it ends

	raftConns  chan net.Conn
	raftClosed chan struct{}
	raftOnce   sync.Once

	// ctx is cancelled by close; closing is its Done channel.
	ctx     context.Context
	cancel  context.CancelFunc
	closing <-chan struct{}

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
	// raftServing counts the accepted connections handed to Raft that its
	// handlers have not closed yet (trackedConn.served).
	raftServing sync.WaitGroup
}

func newMux(ln net.Listener, advertise string, tlsConf *tls.Config, dial DialFunc, auth muxAuth, logger *slog.Logger) *mux {
	if dial == nil {
		var d net.Dialer
		dial = func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &mux{
		ctx:        ctx,
		cancel:     cancel,
		closing:    ctx.Done(),
		ln:         ln,
		advertise:  advertise,
		tls:        tlsConf,
		dial:       dial,
		auth:       auth,
		log:        logger,
		raftConns:  make(chan net.Conn),
		raftClosed: make(chan struct{}),
		conns:      make(map[net.Conn]struct{}),
	}
}

// start begins accepting; forward handles forwarding connections.
func (m *mux) start(forward func(net.Conn)) {
	m.forward = forward
	m.wg.Add(1)
	go m.acceptLoop()
}

// track registers c for Close; false when the mux is already closed (the
// caller must close c itself).
func (m *mux) track(c net.Conn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.conns[c] = struct{}{}
	return true
}

func (m *mux) untrack(c net.Conn) {
	m.mu.Lock()
	delete(m.conns, c)
	m.mu.Unlock()
}

func (m *mux) acceptLoop() {
	defer m.wg.Done()
	var backoff time.Duration
	for {
		c, err := m.ln.Accept()
		if err != nil {
			select {
			case <-m.closing:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient (e.g. too many open files): back off, keep serving.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			m.log.Warn("cluster: accept failed", "err", err, "retry_in", backoff)
			select {
			case <-m.closing:
				return
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		tc := &trackedConn{Conn: c, m: m}
		if !m.track(tc) {
			c.Close()
			return
		}
		m.wg.Add(1)
		go m.route(tc)
	}
}

// route performs the server side of TLS, reads the protocol byte and hands
// the connection on. It runs in its own goroutine so a slow handshake never
// blocks accepting.
func (m *mux) route(c net.Conn) {
	defer m.wg.Done()
	_ = c.SetDeadline(time.Now().Add(muxHandshakeTimeout))
	conn := c
	if m.tls != nil {
		tc := tls.Server(c, m.tls)
		if err := tc.Handshake(); err != nil {
			m.log.Debug("cluster: TLS handshake failed", "remote", c.RemoteAddr(), "err", err)
			c.Close()
			return
		}
		conn = tc
	}
	var kind [1]byte
	if _, err := io.ReadFull(conn, kind[:]); err != nil {
		conn.Close()
		return
	}
	switch kind[0] {
	case StreamRaft:
		authed, err := m.acceptRaft(conn)
		if err != nil {
			m.log.Warn("cluster: refused Raft stream", "remote", c.RemoteAddr(), "err", err)
			if m.auth.onFailure != nil {
				m.auth.onFailure(c.RemoteAddr(), err)
			}
			conn.Close()
			return
		}
		_ = c.SetDeadline(time.Time{})
		conn = authed
		if tc, ok := c.(*trackedConn); ok {
			// Raft's handler closes it when it returns (or this goroutine
			// does, below, when Raft takes no more connections).
			m.raftServing.Add(1)
			tc.served.Store(true)
		}
		select {
		case m.raftConns <- conn:
		case <-m.raftClosed:
			conn.Close()
		case <-m.closing:
			conn.Close()
		}
	case StreamForward:
		_ = c.SetDeadline(time.Time{}) // the forwarding server bounds its own handshake
		m.forward(conn)
	default:
		m.log.Debug("cluster: unknown stream type", "remote", c.RemoteAddr(), "byte", kind[0])
		conn.Close()
	}
}

// acceptRaft runs the server side of the Raft stream handshake: the peer
// proves the AuthKey (and, with TLS, that its certificate names the node id
// it claims) before a byte reaches hashicorp/raft.
func (m *mux) acceptRaft(conn net.Conn) (net.Conn, error) {
	rw := bufio.NewReadWriter(bufio.NewReaderSize(conn, 256), bufio.NewWriterSize(conn, 256))
	_, err := serverHandshake(rw, protoRaft, m.auth.key, func(id string) error { return checkPeerIdentity(conn, id) })
	if err != nil {
		return nil, err
	}
	return withBuffered(conn, rw.Reader), nil
}

// withBuffered returns conn, or, if the handshake's reader holds bytes read
// past the handshake, a conn that returns those first.
func withBuffered(conn net.Conn, r *bufio.Reader) net.Conn {
	n := r.Buffered()
	if n == 0 {
		return conn
	}
	rest, _ := r.Peek(n)
	return &prefixedConn{Conn: conn, r: io.MultiReader(bytes.NewReader(bytes.Clone(rest)), conn)}
}

type prefixedConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// dialStream connects to addr, performs the client side of TLS (checking,
// when expectID is known, that the server's certificate names that node)
// and sends the protocol byte. A Raft stream also runs the client side of
// the Raft handshake. The connection is tracked until closed.
func (m *mux) dialStream(ctx context.Context, addr string, kind byte, expectID string) (net.Conn, error) {
	select {
	case <-m.closing:
		return nil, ErrClosed
	default:
	}
	raw, err := m.dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	tc := &trackedConn{Conn: raw, m: m}
	if !m.track(tc) {
		raw.Close()
		return nil, ErrClosed
	}
	var conn net.Conn = tc
	if deadline, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(deadline)
	}
	if m.tls != nil {
		cfg := m.tls.Clone()
		if cfg.ServerName == "" {
			if host, _, err := net.SplitHostPort(addr); err == nil {
				cfg.ServerName = host
			}
		}
		tlsConn := tls.Client(tc, cfg)
		if err := tlsConn.HandshakeContext(ctx); err != nil {
			tc.Close()
			return nil, fmt.Errorf("TLS handshake with %s: %w", addr, err)
		}
		if expectID != "" {
			if err := checkPeerIdentity(tlsConn, expectID); err != nil {
				tc.Close()
				return nil, fmt.Errorf("%w: TLS peer at %s: %w", ErrAuth, addr, err)
			}
		}
		conn = tlsConn
	}
	if _, err := conn.Write([]byte{kind}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("write stream type to %s: %w", addr, err)
	}
	if kind == StreamRaft {
		rw := bufio.NewReadWriter(bufio.NewReaderSize(conn, 256), bufio.NewWriterSize(conn, 256))
		if err := clientHandshake(rw, protoRaft, m.auth.key, m.auth.selfID); err != nil {
			conn.Close()
			return nil, fmt.Errorf("raft stream to %s: %w", addr, err)
		}
		conn = withBuffered(conn, rw.Reader)
	}
	_ = raw.SetDeadline(time.Time{})
	return conn, nil
}

// expectedID is the node id expected at addr ("" when unknown).
func (m *mux) expectedID(addr string) string {
	if m.auth.idForAddr == nil {
		return ""
	}
	return m.auth.idForAddr(addr)
}

// close stops accepting and closes every tracked connection.
func (m *mux) close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.wg.Wait()
		return
	}
	m.closed = true
	m.cancel()
	conns := make([]net.Conn, 0, len(m.conns))
	for c := range m.conns {
		conns = append(conns, c)
	}
	m.conns = nil
	m.mu.Unlock()
	m.ln.Close()
	for _, c := range conns {
		// The connection itself, not its owner's Close: a connection
		// served to Raft counts as released only when Raft's handler
		// returns and closes it (waitRaftHandlers).
		if tc, ok := c.(*trackedConn); ok {
			tc.Conn.Close()
		} else {
			c.Close()
		}
	}
	m.wg.Wait()
}

// waitRaftHandlers waits until Raft's handlers of accepted connections
// have returned, or ctx ends (false). Raft handles a heartbeat on the
// transport's goroutine, writing the term to the stable store: the store
// must stay open until those handlers are done.
func (m *mux) waitRaftHandlers(ctx context.Context) bool {
	done := make(chan struct{})
	go func() {
		m.raftServing.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// trackedConn forgets itself on Close.
type trackedConn struct {
	net.Conn
	m    *mux
	once sync.Once
	// served: handed to Raft, whose handler closes it when it returns.
	served atomic.Bool
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.m.untrack(c)
		if c.served.Load() {
			c.m.raftServing.Done()
		}
	})
	return err
}

// raftStream adapts the mux to raft.StreamLayer.
type raftStream struct{ m *mux }

var _ raft.StreamLayer = raftStream{}

func (s raftStream) Accept() (net.Conn, error) {
	select {
	case c := <-s.m.raftConns:
		return c, nil
	case <-s.m.raftClosed:
		return nil, net.ErrClosed
	case <-s.m.closing:
		return nil, net.ErrClosed
	}
}

// Close stops handing connections to Raft; the physical listener belongs to
// the mux (the forwarding server still uses it while Raft shuts down).
func (s raftStream) Close() error {
	s.m.raftOnce.Do(func() { close(s.m.raftClosed) })
	return nil
}

// Addr is the advertised address: hashicorp/raft tells peers this one.
func (s raftStream) Addr() net.Addr { return advertisedAddr(s.m.advertise) }

func (s raftStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	// Derived from the mux's context: a pending dial aborts when the node closes.
	ctx, cancel := context.WithTimeout(s.m.ctx, timeout)
	defer cancel()
	return s.m.dialStream(ctx, string(address), StreamRaft, s.m.expectedID(string(address)))
}

type advertisedAddr string

func (a advertisedAddr) Network() string { return "tcp" }
func (a advertisedAddr) String() string  { return string(a) }
