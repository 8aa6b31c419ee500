package transport

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/binread"
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
	r := binread.New(payload)
	// Each proposal takes at least 16 id bytes and a length byte.
	count := r.Count("proposal count", 0, 16+1)
	if err := payloadErr(r); err != nil {
		return proposeRequest{}, err
	}
	req := proposeRequest{count: count, props: make([]fsm.Proposal, 0, count), rejected: map[int]string{}}
	for i := 0; i < req.count; i++ {
		var id fsm.ProposalID
		copy(id[:], r.Bytes(len(id), "proposal id"))
		raw := r.BlobView("event", 0)
		if err := payloadErr(r); err != nil {
			return proposeRequest{}, err
		}
		ev, err := fsm.DecodeEvent(raw)
		if err != nil {
			req.rejected[i] = fmt.Sprintf("not proposed: the leader cannot decode the event: %v", err)
			continue
		}
		req.props = append(req.props, fsm.Proposal{ID: id, Event: ev})
	}
	if r.Remaining() != 0 {
		return proposeRequest{}, fmt.Errorf("%d bytes after %d proposals", r.Remaining(), req.count)
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
	r := binread.New(resp)
	index := r.Uint64BE("index")
	if err := payloadErr(r); err != nil {
		return 0, nil, err
	}
	results, err := fsm.DecodeResults(r.Rest())
	if err != nil {
		return 0, nil, err
	}
	if len(results) != count {
		return 0, nil, fmt.Errorf("%d results for %d proposals", len(results), count)
	}
	return index, results, nil
}

func decodeMembership(payload []byte) (id, addr string, forwarded bool, err error) {
	r := binread.New(payload)
	id, addr = r.String("id", 0), r.String("addr", 0)
	hop := r.U8("forwarded")
	if err := payloadErr(r); err != nil {
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
	r := binread.New(payload)
	id, index = r.String("id", 0), r.Uint64BE("index")
	if err := payloadErr(r); err != nil {
		return "", 0, err
	}
	return id, index, nil
}
