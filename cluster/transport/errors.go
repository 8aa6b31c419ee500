package transport

import (
	"errors"
	"fmt"

	"github.com/tether-project/tether/internal/binread"
)

// The errors a node reports to its callers and to its peers. They live here,
// below the node package, because the forwarding protocol carries them: a
// response code names one of them, and the client maps it back, so a caller
// on a follower sees the same sentinel (errors.Is) as one on the leader.
// Package cluster re-exports them under the same names.
var (
	// ErrUnavailable: no leader, or no quorum, within the proposal deadline.
	// The edge falls back to degraded routing on it. The proposal may still
	// commit later (it was possibly appended); its id makes a retry safe.
	ErrUnavailable = errors.New("cluster: unavailable (no leader or no quorum within the deadline)")
	// ErrNotLeader: the operation needs the leader and this node is not it.
	ErrNotLeader = errors.New("cluster: not the leader")
	// ErrClosed: the node is closed or closing.
	ErrClosed = errors.New("cluster: node closed")
	// ErrHalted: the node stopped applying the log (see cluster.Node.Fatal).
	ErrHalted = errors.New("cluster: node halted")
	// ErrBadRequest: the request cannot be acted on as asked (BadRequest),
	// locally or as a remote node answered; never retried.
	ErrBadRequest = errors.New("cluster: bad request")

	// ErrAuth marks a refused handshake (wrong AuthKey, or a TLS peer whose
	// certificate does not name the node it claims to be). Not retryable.
	ErrAuth = errors.New("inter-node handshake refused")
	// ErrConnBroken marks a call that failed because its connection did (the
	// request may or may not have reached the server). Retryable.
	ErrConnBroken = errors.New("forwarding connection broken")
)

// NotLeaderError carries the leader this node knows of, if any.
type NotLeaderError struct {
	LeaderID, LeaderAddr string
}

func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return ErrNotLeader.Error() + " (no leader known)"
	}
	return fmt.Sprintf("%s (leader is %s at %s)", ErrNotLeader, e.LeaderID, e.LeaderAddr)
}

func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }

// RemoteError is a failure reported by another node over the forwarding
// protocol.
type RemoteError struct {
	Addr string
	Msg  string
	// Cause is the sentinel the remote code maps to (nil for others).
	Cause error
}

func (e *RemoteError) Error() string { return fmt.Sprintf("cluster: node at %s: %s", e.Addr, e.Msg) }
func (e *RemoteError) Unwrap() error { return e.Cause }

// MalformedResponseError is a peer's answer this build cannot decode.
type MalformedResponseError struct {
	Addr string
	Err  error
}

func (e *MalformedResponseError) Error() string {
	return fmt.Sprintf("cluster: malformed answer from %s: %v", e.Addr, e.Err)
}
func (e *MalformedResponseError) Unwrap() error { return e.Err }

// badRequestError marks a malformed forwarding request.
type badRequestError struct{ msg string }

func (e *badRequestError) Error() string { return "bad request: " + e.msg }

func (e *badRequestError) Is(target error) bool { return target == ErrBadRequest }

// BadRequest is a Handler's answer to a request it cannot act on as asked
// (answered with the "bad request" code; never retried).
func BadRequest(format string, args ...any) error {
	return &badRequestError{msg: fmt.Sprintf(format, args...)}
}

// encodeError turns a handler error into a response code and payload.
func encodeError(err error) (byte, []byte) {
	msg := appendStr(nil, err.Error())
	var nl *NotLeaderError
	var br *badRequestError
	switch {
	case errors.As(err, &nl):
		return codeNotLeader, appendStr(appendStr(msg, nl.LeaderID), nl.LeaderAddr)
	case errors.Is(err, ErrNotLeader):
		return codeNotLeader, appendStr(appendStr(msg, ""), "")
	case errors.Is(err, ErrHalted):
		return codeHalted, msg
	case errors.Is(err, ErrClosed):
		return codeClosed, msg
	case errors.Is(err, ErrUnavailable):
		return codeUnavailable, msg
	case errors.As(err, &br):
		return codeBadRequest, msg
	}
	return codeFailed, msg
}

// decodeError is the client side of encodeError.
func decodeError(addr string, code byte, payload []byte) error {
	r := binread.New(payload)
	msg := r.String("message", 0)
	if r.Failed() {
		msg = fmt.Sprintf("error code %d (unreadable message)", code)
	}
	re := &RemoteError{Addr: addr, Msg: msg}
	switch code {
	case codeNotLeader:
		id, a := r.String("leader id", 0), r.String("leader addr", 0)
		if r.Failed() {
			id, a = "", ""
		}
		re.Cause = &NotLeaderError{LeaderID: id, LeaderAddr: a}
	case codeUnavailable:
		re.Cause = ErrUnavailable
	case codeClosed:
		re.Cause = ErrClosed
	case codeHalted:
		re.Cause = ErrHalted
	case codeBadRequest:
		re.Cause = ErrBadRequest
	}
	return re
}
