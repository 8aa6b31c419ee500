package cluster

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"time"
)

// defaultCallTimeout bounds a forwarding call whose context has no deadline.
const defaultCallTimeout = 10 * time.Second

// errConnBroken marks a call that failed because its connection did (the
// request may or may not have reached the server).
var errConnBroken = errors.New("forwarding connection broken")

// forwardClient keeps one authenticated, multiplexed connection per peer
// address and issues calls over it.
type forwardClient struct {
	selfID string
	key    []byte
	dial   func(ctx context.Context, addr string) (net.Conn, error) // stream-typed dial (mux.dialStream)

	mu     sync.Mutex
	conns  map[string]*fwdConn
	closed bool
	wg     sync.WaitGroup
}

func newForwardClient(selfID string, key []byte, dial func(ctx context.Context, addr string) (net.Conn, error)) *forwardClient {
	return &forwardClient{selfID: selfID, key: key, dial: dial, conns: make(map[string]*fwdConn)}
}

type fwdResponse struct {
	code    byte
	payload []byte
}

type fwdConn struct {
	addr string
	conn net.Conn
	r    *bufio.Reader

	wmu sync.Mutex
	w   *bufio.Writer

	mu      sync.Mutex
	pending map[uint64]chan fwdResponse
	nextID  uint64
	err     error         // set once the connection failed
	dead    chan struct{} // closed with err
}

// call sends one request to addr and waits for its response. A non-OK code
// comes back as an error from decodeError.
func (c *forwardClient) call(ctx context.Context, addr string, op byte, payload []byte) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultCallTimeout)
		defer cancel()
	}
	fc, err := c.get(ctx, addr)
	if err != nil {
		return nil, err
	}
	// Every request carries the caller's remaining budget so the server
	// gives up when the caller has.
	deadline, _ := ctx.Deadline()
	budget := time.Until(deadline).Milliseconds()
	if budget < 1 {
		budget = 1
	}
	framed := make([]byte, 4, 4+len(payload))
	binary.BigEndian.PutUint32(framed, uint32(min(budget, math.MaxUint32)))
	framed = append(framed, payload...)
	resp, err := fc.roundTrip(ctx, op, framed)
	if err != nil {
		if errors.Is(err, errConnBroken) {
			c.drop(fc)
		}
		return nil, err
	}
	if resp.code != codeOK {
		return nil, decodeError(addr, resp.code, resp.payload)
	}
	return resp.payload, nil
}

func (c *forwardClient) get(ctx context.Context, addr string) (*fwdConn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if fc := c.conns[addr]; fc != nil {
		c.mu.Unlock()
		return fc, nil
	}
	c.mu.Unlock()

	fc, err := c.connect(ctx, addr)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		fc.conn.Close()
		return nil, ErrClosed
	}
	if existing := c.conns[addr]; existing != nil {
		// Lost a connect race: keep the established one.
		fc.conn.Close()
		return existing, nil
	}
	c.conns[addr] = fc
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		fc.readLoop()
		c.drop(fc)
	}()
	return fc, nil
}

func (c *forwardClient) connect(ctx context.Context, addr string) (*fwdConn, error) {
	conn, err := c.dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errConnBroken, err)
	}
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	rw := bufio.NewReadWriter(bufio.NewReaderSize(conn, 64<<10), bufio.NewWriterSize(conn, 64<<10))
	if err := clientHandshake(rw, protoForward, c.key, c.selfID); err != nil {
		conn.Close()
		if errors.Is(err, errAuth) {
			return nil, fmt.Errorf("forward to %s: %w", addr, err)
		}
		return nil, fmt.Errorf("forward to %s: %w: handshake: %w", addr, errConnBroken, err)
	}
	_ = conn.SetDeadline(time.Time{})
	return &fwdConn{
		addr:    addr,
		conn:    conn,
		r:       rw.Reader,
		w:       rw.Writer,
		pending: make(map[uint64]chan fwdResponse),
		dead:    make(chan struct{}),
	}, nil
}

// drop forgets fc (if still current) and closes it.
func (c *forwardClient) drop(fc *fwdConn) {
	c.mu.Lock()
	if c.conns[fc.addr] == fc {
		delete(c.conns, fc.addr)
	}
	c.mu.Unlock()
	fc.fail(errConnBroken)
}

// close closes every connection and waits for their readers.
func (c *forwardClient) close() {
	c.mu.Lock()
	c.closed = true
	conns := c.conns
	c.conns = map[string]*fwdConn{}
	c.mu.Unlock()
	for _, fc := range conns {
		fc.fail(ErrClosed)
	}
	c.wg.Wait()
}

func (fc *fwdConn) fail(err error) {
	fc.mu.Lock()
	if fc.err == nil {
		fc.err = err
		close(fc.dead)
	}
	fc.mu.Unlock()
	fc.conn.Close()
}

func (fc *fwdConn) readLoop() {
	for {
		code, id, payload, err := readFrame(fc.r)
		if err != nil {
			fc.fail(fmt.Errorf("%w: read from %s: %w", errConnBroken, fc.addr, err))
			return
		}
		fc.mu.Lock()
		ch := fc.pending[id]
		delete(fc.pending, id)
		fc.mu.Unlock()
		if ch != nil {
			ch <- fwdResponse{code: code, payload: payload}
		}
	}
}

func (fc *fwdConn) roundTrip(ctx context.Context, op byte, payload []byte) (fwdResponse, error) {
	ch := make(chan fwdResponse, 1)
	fc.mu.Lock()
	if fc.err != nil {
		err := fc.err
		fc.mu.Unlock()
		return fwdResponse{}, fmt.Errorf("%w: %w", errConnBroken, err)
	}
	fc.nextID++
	id := fc.nextID
	fc.pending[id] = ch
	fc.mu.Unlock()
	forget := func() {
		fc.mu.Lock()
		delete(fc.pending, id)
		fc.mu.Unlock()
	}

	deadline, _ := ctx.Deadline()
	fc.wmu.Lock()
	_ = fc.conn.SetWriteDeadline(deadline)
	err := writeFrame(fc.w, op, id, payload)
	if err == nil {
		err = fc.w.Flush()
	}
	fc.wmu.Unlock()
	if err != nil {
		forget()
		fc.fail(err)
		return fwdResponse{}, fmt.Errorf("%w: write to %s: %w", errConnBroken, fc.addr, err)
	}
	select {
	case resp := <-ch:
		return resp, nil
	case <-fc.dead:
		forget()
		select {
		case resp := <-ch: // answered just before the connection went
			return resp, nil
		default:
		}
		return fwdResponse{}, fmt.Errorf("%w: %s", errConnBroken, fc.addr)
	case <-ctx.Done():
		forget()
		return fwdResponse{}, fmt.Errorf("forward to %s: %w", fc.addr, ctx.Err())
	}
}
