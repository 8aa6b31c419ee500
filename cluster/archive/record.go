package archive

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/binread"
)

// Record is one committed Raft log entry as the archive keeps it: the raw
// entry (a batch of proposals in fsm's envelope) plus what applying it did,
// so an audit sees evictions without replaying the log.
type Record struct {
	Index uint64 // Raft log index
	Time  int64  // the leader's AppendedAt, unix nanoseconds (the fsm's entry time)
	Data  []byte // the entry exactly as committed (fsm.EncodeEntry)
	// Outcomes holds one element per proposal of the entry, in order. It may
	// be shorter than the entry when the machine halted part-way (it never is
	// for a node that applied the entry).
	Outcomes []Outcome
}

// Outcome is the effect of applying one proposal.
type Outcome struct {
	Status  fsm.Status
	Reason  string        // why a proposal was rejected
	Evicted []fsm.Evicted // bindings this proposal removed, in order
	// Epoch is the epoch of the binding in force for the event's key after
	// apply (fsm.Result.Binding.Epoch when found; the placement a Bind or
	// rebinding Overflow created), 0 otherwise. Records written before
	// epochs were recorded (format 1) hold 0; their epochs were entry
	// indexes.
	Epoch uint64
}

// OutcomesFromResults converts the machine's results for one entry.
func OutcomesFromResults(rs []fsm.Result) []Outcome {
	out := make([]Outcome, len(rs))
	for i, r := range rs {
		out[i] = Outcome{Status: r.Status, Reason: r.Reason, Evicted: r.Evicted}
		if r.Found {
			out[i].Epoch = r.Binding.Epoch
		}
	}
	return out
}

// Proposals decodes the entry's proposals.
func (r Record) Proposals() ([]fsm.RawProposal, error) {
	ps, err := fsm.DecodeEntry(r.Data)
	if err != nil {
		return nil, fmt.Errorf("archive: record %d: %w", r.Index, err)
	}
	return ps, nil
}

// Keys lists the bindings the record names: the keys of its events (as
// fsm.EventKeys reports them) and of the bindings its apply evicted,
// deduplicated, in first-seen order. An entry that does not decode
// contributes only its evictions.
func (r Record) Keys() []fsm.FleetKey {
	t := r.indexTerms()
	return t.keys
}

// indexTerms is what the archive indexes a record under, from one decode
// of its entry.
type indexTerms struct {
	keys      []fsm.FleetKey
	roots     []string
	proposals int // for retention; an entry that does not decode counts its outcomes
}

func (r Record) indexTerms() indexTerms {
	var t indexTerms
	seen := make(map[fsm.FleetKey]struct{})
	add := func(k fsm.FleetKey) {
		if _, dup := seen[k]; dup {
			return
		}
		seen[k] = struct{}{}
		t.keys = append(t.keys, k)
	}
	t.proposals = len(r.Outcomes)
	if ps, err := fsm.DecodeEntry(r.Data); err == nil {
		t.proposals = len(ps)
		for _, p := range ps {
			if p.Event == nil {
				continue
			}
			for _, k := range fsm.EventKeys(p.Event) {
				add(k)
			}
			if l, ok := p.Event.(fsm.Link); ok && l.Root != "" && !slices.Contains(t.roots, l.Root) {
				t.roots = append(t.roots, l.Root)
			}
		}
	}
	for _, o := range r.Outcomes {
		for _, e := range o.Evicted {
			add(fsm.FleetKey{Fleet: e.Fleet, Key: e.Key})
		}
	}
	return t
}

// recordVersion is the first byte of every stored record value this build
// writes. Version 2 appends each outcome's epoch; version 1 is still read.
const (
	recordVersion   = 2
	recordVersionV1 = 1
)

// encodeRecord lays a record out as
//
//	version u8 | time i64 BE | proposals uvarint | outcomes uvarint | outcome... | data (rest)
//
// outcome = status u8 | reason str | evicted uvarint | (fleet u8 | key str |
// instance str | epoch uvarint | reason u8)... | epoch uvarint (version 2);
// str = uvarint length | bytes.
// The proposal count is kept so count-based retention needs no entry decode.
func encodeRecord(r Record, proposals int) []byte {
	b := make([]byte, 0, 32+len(r.Data)+16*len(r.Outcomes))
	b = append(b, recordVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Time))
	b = binary.AppendUvarint(b, uint64(proposals))
	b = binary.AppendUvarint(b, uint64(len(r.Outcomes)))
	for _, o := range r.Outcomes {
		b = append(b, byte(o.Status))
		b = appendString(b, o.Reason)
		b = binary.AppendUvarint(b, uint64(len(o.Evicted)))
		for _, e := range o.Evicted {
			b = append(b, byte(e.Fleet))
			b = appendString(b, e.Key)
			b = appendString(b, e.Instance)
			b = binary.AppendUvarint(b, e.Epoch)
			b = append(b, byte(e.Reason))
		}
		b = binary.AppendUvarint(b, o.Epoch)
	}
	return append(b, r.Data...)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// readErr is r's failure as an error (nil when there is none).
func readErr(r *binread.Reader) error {
	if r.Err == nil {
		return nil
	}
	return r.Err
}

var errBadRecordVersion = errors.New("unsupported record version")

// decodeRecord is the inverse of encodeRecord. Data aliases b (bbolt memory
// is only valid inside its transaction: callers copy).
func decodeRecord(index uint64, b []byte) (Record, int, error) {
	d := binread.New(b)
	version := d.U8("version")
	if !d.Failed() && version != recordVersion && version != recordVersionV1 {
		return Record{}, 0, fmt.Errorf("archive: record %d: %w %d", index, errBadRecordVersion, version)
	}
	r := Record{Index: index}
	r.Time = int64(d.Uint64BE("time"))
	proposals := int(d.Uvarint("proposal count"))
	n := d.Count("outcome count", 0, 3)
	if n > 0 {
		r.Outcomes = make([]Outcome, n)
	}
	for i := 0; i < n && !d.Failed(); i++ {
		o := &r.Outcomes[i]
		o.Status = fsm.Status(d.U8("status"))
		o.Reason = d.String("reason", 0)
		m := d.Count("evicted count", 0, 5)
		if m > 0 {
			o.Evicted = make([]fsm.Evicted, m)
		}
		for j := 0; j < m && !d.Failed(); j++ {
			e := &o.Evicted[j]
			e.Fleet = fsm.Fleet(d.U8("evicted fleet"))
			e.Key = d.String("evicted key", 0)
			e.Instance = d.String("evicted instance", 0)
			e.Epoch = d.Uvarint("evicted epoch")
			e.Reason = fsm.EvictReason(d.U8("evicted reason"))
		}
		if version >= 2 {
			o.Epoch = d.Uvarint("epoch")
		}
	}
	if err := readErr(d); err != nil {
		return Record{}, 0, fmt.Errorf("archive: record %d: %w", index, err)
	}
	r.Data = b[d.Off:]
	return r, proposals, nil
}

// decodeRecordHeader reads only the time and proposal count.
func decodeRecordHeader(b []byte) (t int64, proposals int, err error) {
	d := binread.New(b)
	if v := d.U8("version"); !d.Failed() && v != recordVersion && v != recordVersionV1 {
		return 0, 0, fmt.Errorf("%w %d", errBadRecordVersion, v)
	}
	t = int64(d.Uint64BE("time"))
	proposals = int(d.Uvarint("proposal count"))
	return t, proposals, readErr(d)
}

func cloneRecord(r Record) Record {
	r.Data = append([]byte(nil), r.Data...)
	return r
}
