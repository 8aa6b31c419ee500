package cluster

import (
	"errors"
	"fmt"
)

var (
	// ErrUnavailable: no leader, or no quorum, within the proposal deadline.
	// The edge falls back to degraded routing on it. The proposal may still
	// commit later (it was possibly appended); its id makes a retry safe.
	ErrUnavailable = errors.New("cluster: unavailable (no leader or no quorum within the deadline)")
	// ErrNotLeader: the operation needs the leader and this node is not it.
	ErrNotLeader = errors.New("cluster: not the leader")
	// ErrClosed: the node is closed or closing.
	ErrClosed = errors.New("cluster: node closed")
	// ErrHalted: the node stopped applying the log (see Node.Fatal).
	ErrHalted = errors.New("cluster: node halted")
	// ErrRemoved: the node was removed from the cluster.
	ErrRemoved = errors.New("cluster: node removed from the cluster")
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

// badRequestError marks a malformed forwarding request.
type badRequestError struct{ msg string }

func (e *badRequestError) Error() string { return "bad request: " + e.msg }

func badRequest(format string, args ...any) error {
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
	r := &wireReader{b: payload}
	msg := r.str()
	if r.err() != nil {
		msg = fmt.Sprintf("error code %d (unreadable message)", code)
	}
	re := &RemoteError{Addr: addr, Msg: msg}
	switch code {
	case codeNotLeader:
		id, a := r.str(), r.str()
		if r.err() != nil {
			id, a = "", ""
		}
		re.Cause = &NotLeaderError{LeaderID: id, LeaderAddr: a}
	case codeUnavailable:
		re.Cause = ErrUnavailable
	case codeClosed:
		re.Cause = ErrClosed
	case codeHalted:
		re.Cause = ErrHalted
	}
	return re
}
