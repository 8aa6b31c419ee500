package cluster

import (
	"bufio"
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"sync"
	"time"
)

// maxConcurrentPerConn bounds the requests one connection may have in
// progress; reading pauses (backpressure) when it is reached.
const maxConcurrentPerConn = 256

// forwardHandlerFunc serves one request from an authenticated peer.
type forwardHandlerFunc func(ctx context.Context, peerID string, op byte, payload []byte) ([]byte, error)

// forwardServer serves forwarding connections handed over by the mux.
type forwardServer struct {
	key    []byte
	handle forwardHandlerFunc
	ctx    context.Context // cancelled when the node closes: aborts handlers
	log    *slog.Logger
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
		return nil, badRequest("frame without a deadline budget")
	}
	budget := time.Duration(binary.BigEndian.Uint32(payload)) * time.Millisecond
	ctx, cancel := context.WithTimeout(s.ctx, budget)
	defer cancel()
	return s.handle(ctx, peerID, op, payload[4:])
}
