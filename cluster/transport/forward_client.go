package transport

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

	"github.com/tether-project/tether/fsm"
)

// defaultCallTimeout bounds a forwarding call whose context has no deadline.
const defaultCallTimeout = 10 * time.Second

// Client keeps one authenticated, multiplexed forwarding connection per
// peer address and issues calls over it.
type Client struct {
	selfID string
	key    []byte
	dial   DialFunc // delivers forwarding streams (mux.dialStream)

	mu     sync.Mutex
	conns  map[string]*fwdConn
	closed bool
	wg     sync.WaitGroup
}

// NewClient makes a client that authenticates as selfID with key over
// connections from dial, which must deliver a connection that already sent
// StreamForward (a Transport's client dials through its mux).
func NewClient(selfID string, key []byte, dial DialFunc) *Client {
	return &Client{selfID: selfID, key: key, dial: dial, conns: make(map[string]*fwdConn)}
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

// Call sends one request to addr and waits for its response. A non-OK code
// comes back as a *RemoteError. The typed calls below encode the payloads;
// Call itself sends any bytes (tests send malformed ones).
func (c *Client) Call(ctx context.Context, addr string, op Op, payload []byte) ([]byte, error) {
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
	resp, err := fc.roundTrip(ctx, byte(op), framed)
	if err != nil {
		if errors.Is(err, ErrConnBroken) {
			c.drop(fc)
		}
		return nil, err
	}
	if resp.code != codeOK {
		return nil, decodeError(addr, resp.code, resp.payload)
	}
	return resp.payload, nil
}

func (c *Client) get(ctx context.Context, addr string) (*fwdConn, error) {
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

func (c *Client) connect(ctx context.Context, addr string) (*fwdConn, error) {
	conn, err := c.dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConnBroken, err)
	}
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	rw := bufio.NewReadWriter(bufio.NewReaderSize(conn, 64<<10), bufio.NewWriterSize(conn, 64<<10))
	if err := clientHandshake(rw, protoForward, c.key, c.selfID); err != nil {
		conn.Close()
		if errors.Is(err, ErrAuth) {
			return nil, fmt.Errorf("forward to %s: %w", addr, err)
		}
		return nil, fmt.Errorf("forward to %s: %w: handshake: %w", addr, ErrConnBroken, err)
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
func (c *Client) drop(fc *fwdConn) {
	c.mu.Lock()
	if c.conns[fc.addr] == fc {
		delete(c.conns, fc.addr)
	}
	c.mu.Unlock()
	fc.fail(ErrConnBroken)
}

// Close closes every connection and waits for their readers.
func (c *Client) Close() {
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
			fc.fail(fmt.Errorf("%w: read from %s: %w", ErrConnBroken, fc.addr, err))
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
		return fwdResponse{}, fmt.Errorf("%w: %w", ErrConnBroken, err)
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
		return fwdResponse{}, fmt.Errorf("%w: write to %s: %w", ErrConnBroken, fc.addr, err)
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
		return fwdResponse{}, fmt.Errorf("%w: %s", ErrConnBroken, fc.addr)
	case <-ctx.Done():
		forget()
		return fwdResponse{}, fmt.Errorf("forward to %s: %w", fc.addr, ctx.Err())
	}
}

// Propose forwards proposals (ids[i] with the encoded event events[i]) to
// the leader at addr: the entry index and one result per proposal. An
// answer this build cannot decode is a *MalformedResponseError.
func (c *Client) Propose(ctx context.Context, addr string, ids []fsm.ProposalID, events [][]byte) (uint64, []fsm.Result, error) {
	resp, err := c.Call(ctx, addr, OpPropose, encodeProposeRequest(ids, events))
	if err != nil {
		return 0, nil, err
	}
	index, results, err := decodeProposeResponse(resp, len(ids))
	if err != nil {
		return 0, nil, &MalformedResponseError{Addr: addr, Err: err}
	}
	return index, results, nil
}

// ChangeMembership asks the node at addr to run a membership operation
// (OpAddVoter, OpRemove, OpTransfer, OpJoinVoter, OpJoinNonvoter) on member
// id at memberAddr; forwarded marks a request already forwarded once.
func (c *Client) ChangeMembership(ctx context.Context, addr string, op Op, id, memberAddr string, forwarded bool) error {
	_, err := c.Call(ctx, addr, op, encodeMembership(id, memberAddr, forwarded))
	return err
}

// Status asks the node at addr for its status (JSON, as its Handler
// encoded it).
func (c *Client) Status(ctx context.Context, addr string) ([]byte, error) {
	return c.Call(ctx, addr, OpStatus, nil)
}

// NotifyRemoved tells the node at addr that member id was removed at index.
func (c *Client) NotifyRemoved(ctx context.Context, addr, id string, index uint64) error {
	_, err := c.Call(ctx, addr, OpRemoved, encodeRemovedNotice(id, index))
	return err
}
