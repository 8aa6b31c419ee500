package transport

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/tether-project/tether/fsm"
)

// Payload codecs of the forwarding operations (layouts in wire.go and
// DESIGN.md). The decoders take bytes from an authenticated peer that may
// still be broken or hostile: they never panic and bound every allocation
// by the payload's length (FuzzForwardPayloads).

// proposeRequest is a decoded op 1 payload.
type proposeRequest struct {
	count int
	props []fsm.Proposal
	// rejected: positions whose event this build cannot decode (a newer
	// follower's), answered StatusRejected without being proposed.
	rejected map[int]string
}

func encodeProposeRequest(ids []fsm.ProposalID, events [][]byte) []byte {
	b := binary.AppendUvarint(make([]byte, 0, 64*len(ids)), uint64(len(ids)))
	for i := range ids {
		b = append(b, ids[i][:]...)
		b = appendBlob(b, events[i])
	}
	return b
}

func decodeProposeRequest(payload []byte) (proposeRequest, error) {
	r := &wireReader{b: payload}
	count := r.uvarint()
	if err := r.err(); err != nil {
		return proposeRequest{}, err
	}
	// Each proposal takes at least 16 id bytes and a length byte.
	if count > uint64(len(payload))/(16+1) {
		return proposeRequest{}, fmt.Errorf("count %d exceeds the frame", count)
	}
	req := proposeRequest{count: int(count), props: make([]fsm.Proposal, 0, count), rejected: map[int]string{}}
	for i := 0; i < req.count; i++ {
		var id fsm.ProposalID
		copy(id[:], r.bytesN(len(id)))
		raw := r.blob()
		if err := r.err(); err != nil {
			return proposeRequest{}, err
		}
		ev, err := fsm.DecodeEvent(raw)
		if err != nil {
			req.rejected[i] = fmt.Sprintf("not proposed: the leader cannot decode the event: %v", err)
			continue
		}
		req.props = append(req.props, fsm.Proposal{ID: id, Event: ev})
	}
	if r.off != len(payload) {
		return proposeRequest{}, fmt.Errorf("%d bytes after %d proposals", len(payload)-r.off, req.count)
	}
	return req, nil
}

func encodeProposeResponse(index uint64, results []fsm.Result) []byte {
	out := binary.BigEndian.AppendUint64(make([]byte, 0, 8+64*len(results)), index)
	return append(out, fsm.EncodeResults(results)...)
}

// decodeProposeResponse reads the leader's answer to a frame of count
// proposals.
func decodeProposeResponse(resp []byte, count int) (uint64, []fsm.Result, error) {
	r := &wireReader{b: resp}
	index := r.u64()
	if err := r.err(); err != nil {
		return 0, nil, err
	}
	results, err := fsm.DecodeResults(r.rest())
	if err != nil {
		return 0, nil, err
	}
	if len(results) != count {
		return 0, nil, fmt.Errorf("%d results for %d proposals", len(results), count)
	}
	return index, results, nil
}

func decodeMembership(payload []byte) (id, addr string, forwarded bool, err error) {
	r := &wireReader{b: payload}
	id, addr = r.str(), r.str()
	hop := r.byte1()
	if err := r.err(); err != nil {
		return "", "", false, err
	}
	if hop > 1 {
		return "", "", false, fmt.Errorf("forwarded flag %d is not 0 or 1", hop)
	}
	if len(id) > MaxNodeIDLen {
		return "", "", false, errors.New("node id too long")
	}
	return id, addr, hop == 1, nil
}

func encodeMembership(id, addr string, forwarded bool) []byte {
	b := appendStr(nil, id)
	b = appendStr(b, addr)
	return append(b, boolByte(forwarded))
}

func encodeRemovedNotice(id string, index uint64) []byte {
	return binary.BigEndian.AppendUint64(appendStr(nil, id), index)
}

func decodeRemovedNotice(payload []byte) (id string, index uint64, err error) {
	r := &wireReader{b: payload}
	id, index = r.str(), r.u64()
	if err := r.err(); err != nil {
		return "", 0, err
	}
	return id, index, nil
}
