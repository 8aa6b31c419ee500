package fsm

import (
	"errors"
	"fmt"

	"github.com/tether-project/tether/internal/binread"
)

// entryVersion is the first byte of an encoded log entry (the batch
// envelope). A different envelope version is a corrupt entry to this build.
const entryVersion = 1

// proposalIDBytes is the encoded size of a ProposalID.
const proposalIDBytes = len(ProposalID{})

// RawProposal is one decoded proposal of a log entry. Event is nil when this
// build does not know the event type; Raw always holds the encoded event, so
// the archive can keep events it cannot interpret.
type RawProposal struct {
	ID    ProposalID
	Type  EventType
	Event Event
	Raw   []byte
}

// EncodeEntry encodes a batch of proposals as one log entry:
// the envelope version byte, a varint count, then per proposal its 16-byte
// id, the varint length of the encoded event and the event.
func EncodeEntry(props []Proposal) ([]byte, error) {
	if len(props) > MaxEntryProposals {
		return nil, fmt.Errorf("fsm: encode entry: %d proposals, the limit per entry is %d", len(props), MaxEntryProposals)
	}
	b := make([]byte, 0, 16+len(props)*256)
	b = append(b, entryVersion)
	b = appendUvarint(b, uint64(len(props)))
	var scratch []byte
	for i := range props {
		var err error
		scratch, err = appendEvent(scratch[:0], props[i].Event)
		if err != nil {
			return nil, fmt.Errorf("fsm: encode entry: proposal %d: %w", i, err)
		}
		b = append(b, props[i].ID[:]...)
		b = appendUvarint(b, uint64(len(scratch)))
		b = append(b, scratch...)
	}
	return b, nil
}

// DecodeEntry decodes a log entry. It never panics: a corrupt or truncated
// entry, or a known event whose payload does not decode, returns
// *DecodeError. Unknown event types are not an error here (Event is nil);
// the machine decides whether to skip or halt.
func DecodeEntry(data []byte) ([]RawProposal, error) {
	r := reader{binread.Reader{Buf: data}}
	if v := r.U8("entry version"); !r.Failed() && v != entryVersion {
		r.Off--
		r.fail("unknown entry envelope version %d (this build reads version %d)", v, entryVersion)
	}
	at := r.Off
	n := r.count("proposal count", proposalIDBytes+2)
	if r.Failed() {
		return nil, r.decodeErr()
	}
	if n > MaxEntryProposals {
		r.Off = at
		r.fail("%d proposals, the limit per entry is %d", n, MaxEntryProposals)
		return nil, r.decodeErr()
	}
	props := make([]RawProposal, n)
	var er reader // the events' reader, one for the entry
	for i := range props {
		p := &props[i]
		copy(p.ID[:], r.Bytes(proposalIDBytes, "proposal id"))
		at := r.Off
		size := r.Uvarint("event length")
		if r.Failed() {
			return nil, r.decodeErr()
		}
		if size == 0 || size > uint64(r.Remaining()) {
			r.Off = at
			r.fail("proposal %d: event length %d does not fit the %d bytes left", i, size, r.Remaining())
			return nil, r.decodeErr()
		}
		start := r.Off
		p.Raw = data[start : start+int(size) : start+int(size)]
		r.Off += int(size)
		p.Type = EventType(p.Raw[0])
		ev, err := decodeEventAt(&er, p.Raw, start)
		if err != nil {
			var unknown *UnknownEventError
			if errors.As(err, &unknown) {
				continue
			}
			return nil, err
		}
		p.Event = ev
	}
	if r.Remaining() != 0 {
		r.fail("%d trailing bytes after %d proposals", r.Remaining(), n)
		return nil, r.decodeErr()
	}
	return props, nil
}

// resultsVersion is the first byte of EncodeResults' output.
const resultsVersion = 1

// EncodeResults encodes apply results for forwarding between nodes (the
// leader returns them to the follower that forwarded the proposals).
func EncodeResults(rs []Result) []byte {
	b := make([]byte, 0, 8+len(rs)*64)
	b = append(b, resultsVersion)
	b = appendUvarint(b, uint64(len(rs)))
	for i := range rs {
		res := &rs[i]
		b = append(b, uint8(res.Status))
		b = appendString(b, res.Reason)
		var flags uint8
		if res.Found {
			flags |= 1
		}
		if res.Created {
			flags |= 2
		}
		// Bit 2 only when there is a rank: results without one stay
		// readable by level-1 builds (a rank exists only at level 2).
		if res.Found && res.Binding.HasRank {
			flags |= 4
		}
		b = append(b, flags)
		if res.Found {
			b = appendBinding(b, &res.Binding)
			if res.Binding.HasRank {
				b = appendUvarint(b, uint64(res.Binding.Rank))
			}
		}
		b = appendUvarint(b, uint64(len(res.Evicted)))
		for _, ev := range res.Evicted {
			b = append(b, uint8(ev.Fleet))
			b = appendString(b, ev.Key)
			b = appendString(b, ev.Instance)
			b = appendUvarint(b, ev.Epoch)
			b = append(b, uint8(ev.Reason))
		}
	}
	return b
}

// DecodeResults decodes EncodeResults' output; corrupt input is *DecodeError.
func DecodeResults(b []byte) ([]Result, error) {
	r := reader{binread.Reader{Buf: b}}
	if v := r.U8("results version"); !r.Failed() && v != resultsVersion {
		r.Off--
		r.fail("unknown results version %d (this build reads version %d)", v, resultsVersion)
	}
	n := r.count("result count", 4)
	if r.Failed() {
		return nil, r.decodeErr()
	}
	rs := make([]Result, n)
	for i := range rs {
		res := &rs[i]
		res.Status = Status(r.U8("Result.Status"))
		res.Reason = r.str("Result.Reason")
		flags := r.U8("Result flags")
		if flags&^7 != 0 || flags&4 != 0 && flags&1 == 0 {
			r.Off--
			r.fail("Result flags: unknown bits 0x%02x", flags)
		}
		res.Found = flags&1 != 0
		res.Created = flags&2 != 0
		if res.Found {
			res.Binding = readBinding(&r)
			if flags&4 != 0 {
				res.Binding.Rank = r.Uint32("Binding.Rank")
				res.Binding.HasRank = true
			}
		}
		if m := r.count("Result.Evicted count", 5); m > 0 {
			res.Evicted = make([]Evicted, m)
			for j := range res.Evicted {
				ev := &res.Evicted[j]
				ev.Fleet = Fleet(r.U8("Evicted.Fleet"))
				ev.Key = r.str("Evicted.Key")
				ev.Instance = r.str("Evicted.Instance")
				ev.Epoch = r.Uvarint("Evicted.Epoch")
				ev.Reason = EvictReason(r.U8("Evicted.Reason"))
			}
		}
		if r.Failed() {
			return nil, r.decodeErr()
		}
	}
	if r.Remaining() != 0 {
		r.fail("%d trailing bytes after %d results", r.Remaining(), n)
		return nil, r.decodeErr()
	}
	return rs, nil
}

// appendBinding is the canonical encoding of a binding without its rank:
// used in results (the rank follows when a flag says so) and, prefixed with
// a record tag and followed by the rank when there is one, as the input of
// the binding's state digest.
func appendBinding(b []byte, x *Binding) []byte {
	b = append(b, uint8(x.Fleet))
	b = appendString(b, x.Key)
	b = appendString(b, x.ConversationID)
	b = appendString(b, x.Instance)
	b = appendUvarint(b, x.Epoch)
	b = appendVarint(b, x.BoundAt)
	b = appendVarint(b, x.LastUsed)
	return appendDecision(b, &x.Decision, appendString)
}

// appendDecision is the one encoding of a Decision, shared by the log's
// events, the entries' results, the state digest and snapshots. ref writes
// the strings a snapshot interns (edge, policy, candidate instances);
// everything else passes appendString.
func appendDecision(b []byte, d *Decision, ref func([]byte, string) []byte) []byte {
	b = ref(b, d.Edge)
	b = ref(b, d.Policy)
	b = appendString(b, d.RequestID)
	b = appendUvarint(b, uint64(len(d.Candidates)))
	for i := range d.Candidates {
		c := &d.Candidates[i]
		b = ref(b, c.Instance)
		b = appendFloat64(b, c.Score)
		b = appendUvarint(b, uint64(c.CachedTokens))
		b = appendUvarint(b, uint64(c.LoadTokens))
	}
	return b
}

func readBinding(r *reader) Binding {
	var x Binding
	x.Fleet = Fleet(r.U8("Binding.Fleet"))
	x.Key = r.str("Binding.Key")
	x.ConversationID = r.str("Binding.ConversationID")
	x.Instance = r.str("Binding.Instance")
	x.Epoch = r.Uvarint("Binding.Epoch")
	x.BoundAt = r.Varint("Binding.BoundAt")
	x.LastUsed = r.Varint("Binding.LastUsed")
	x.Decision = readDecision(r)
	return x
}
