package transport

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/tether-project/tether/fsm"
)

// maxConcurrentPerConn bounds the requests one connection may have in
// progress; reading pauses (backpressure) when it is reached.
const maxConcurrentPerConn = 256

// Handler is what the forwarding server needs from the node: the server
// authenticates peers, decodes requests and encodes answers; the Handler
// acts on them. Its errors travel back as response codes (encodeError): a
// *NotLeaderError, ErrUnavailable, ErrClosed, ErrHalted, BadRequest keep
// their meaning on the caller's side. Every call is bounded by ctx (the
// caller's remaining budget, and the node's lifetime).
type Handler interface {
	// Propose commits forwarded proposals through this node, which must
	// lead: the entry index and one result per proposal.
	Propose(ctx context.Context, props []fsm.Proposal) (index uint64, results []fsm.Result, err error)
	// ChangeMembership runs a membership operation (OpAddVoter, OpRemove,
	// OpTransfer, OpJoinVoter, OpJoinNonvoter); forwarded marks a request a
	// follower already forwarded once.
	ChangeMembership(ctx context.Context, op Op, id, addr string, forwarded bool) error
	// Status is this node's status, JSON-encoded.
	Status(ctx context.Context) ([]byte, error)
	// Removed: peerID (the leader) reports that member id was removed at
	// index.
	Removed(ctx context.Context, peerID, id string, index uint64) error
}

// forwardServer serves forwarding connections handed over by the mux.
type forwardServer struct {
	key []byte
	h   Handler
	ctx context.Context // cancelled when the node closes: aborts handlers
	log *slog.Logger
	// onAuthFailure counts refused handshakes (metrics, tests).
	onAuthFailure func(remote net.Addr, err error)
}

// serve runs one connection to completion (the mux's route goroutine).
func (s *forwardServer) serve(conn net.Conn) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(muxHandshakeTimeout))
	rw := bufio.NewReadWriter(bufio.NewReaderSize(conn, 64<<10), bufio.NewWriterSize(conn, 64<<10))
	peerID, err := serverHandshake(rw, protoForward, s.key, func(id string) error { return checkPeerIdentity(conn, id) })
	if err != nil {
		s.log.Warn("cluster: refused forwarding connection", "remote", conn.RemoteAddr(), "err", err)
		if s.onAuthFailure != nil {
			s.onAuthFailure(conn.RemoteAddr(), err)
		}
		return
	}
	_ = conn.SetDeadline(time.Time{})

	// Closing the connection when the node closes ends the read loop below.
	stop := context.AfterFunc(s.ctx, func() { conn.Close() })
	defer stop()

	var (
		wmu      sync.Mutex
		handlers sync.WaitGroup
		slots    = make(chan struct{}, maxConcurrentPerConn)
	)
	defer handlers.Wait()
	for {
		op, id, payload, err := readFrame(rw.Reader)
		if err != nil {
			return
		}
		select {
		case slots <- struct{}{}:
		case <-s.ctx.Done():
			return
		}
		handlers.Add(1)
		go func() {
			defer handlers.Done()
			defer func() { <-slots }()
			resp, herr := s.dispatch(peerID, op, payload)
			code := codeOK
			if herr != nil {
				code, resp = encodeError(herr)
			}
			wmu.Lock()
			defer wmu.Unlock()
			// A peer that stops reading must not pin this handler forever.
			_ = conn.SetWriteDeadline(time.Now().Add(defaultCallTimeout))
			if err := writeFrame(rw.Writer, code, id, resp); err == nil {
				err = rw.Flush()
				if err != nil {
					conn.Close()
				}
			} else {
				conn.Close()
			}
		}()
	}
}

// dispatch strips the caller's budget (u32 milliseconds) and runs the
// handler under a context bounded by it and by the node's lifetime.
func (s *forwardServer) dispatch(peerID string, op byte, payload []byte) ([]byte, error) {
	if len(payload) < 4 {
		return nil, BadRequest("frame without a deadline budget")
	}
	budget := time.Duration(binary.BigEndian.Uint32(payload)) * time.Millisecond
	ctx, cancel := context.WithTimeout(s.ctx, budget)
	defer cancel()
	return s.handle(ctx, peerID, Op(op), payload[4:])
}

// handle decodes one request and runs it on the Handler.
func (s *forwardServer) handle(ctx context.Context, peerID string, op Op, payload []byte) ([]byte, error) {
	switch op {
	case OpPropose:
		return s.propose(ctx, payload)
	case OpAddVoter, OpRemove, OpTransfer, OpJoinVoter, OpJoinNonvoter:
		id, addr, forwarded, err := decodeMembership(payload)
		if err != nil {
			return nil, BadRequest("%s: %v", op, err)
		}
		return nil, s.h.ChangeMembership(ctx, op, id, addr, forwarded)
	case OpStatus:
		return s.h.Status(ctx)
	case OpRemoved:
		id, index, err := decodeRemovedNotice(payload)
		if err != nil {
			return nil, BadRequest("removed notice: %v", err)
		}
		return nil, s.h.Removed(ctx, peerID, id, index)
	}
	return nil, BadRequest("unknown operation %d", byte(op))
}

// propose is the server side of a forwarded batch. Events this build cannot
// decode (say, from a newer follower) are answered as rejected without
// being proposed; the rest of the frame goes ahead.
func (s *forwardServer) propose(ctx context.Context, payload []byte) ([]byte, error) {
	req, err := decodeProposeRequest(payload)
	if err != nil {
		return nil, BadRequest("propose: %v", err)
	}
	index, results, err := s.h.Propose(ctx, req.props)
	if err != nil {
		return nil, err
	}
	if len(results) != len(req.props) {
		return nil, fmt.Errorf("propose: %d results for %d proposals", len(results), len(req.props))
	}
	if len(req.rejected) > 0 {
		all := make([]fsm.Result, 0, req.count)
		next := 0
		for i := 0; i < req.count; i++ {
			if reason, bad := req.rejected[i]; bad {
				all = append(all, fsm.Result{Status: fsm.StatusRejected, Reason: reason})
				continue
			}
			all = append(all, results[next])
			next++
		}
		results = all
	}
	return encodeProposeResponse(index, results), nil
}
