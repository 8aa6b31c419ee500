package audit

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
)

// ExportOptions select what Export writes.
type ExportOptions struct {
	From, To uint64 // archive index range (0: from the first / through the last)
	Progress Progress
}

// ExportedEvent is one line of `tether audit export --format ndjson`.
type ExportedEvent struct {
	Index      uint64      `json:"index"`
	Time       string      `json:"time"` // log time, RFC 3339 with nanoseconds
	Proposal   int         `json:"proposal"`
	ProposalID string      `json:"proposal_id,omitempty"` // hex; omitted for the all-zero id
	Type       string      `json:"type"`
	Fields     any         `json:"fields"`
	Effects    EffectsJSON `json:"effects"`
	Error      string      `json:"error,omitempty"` // the entry did not decode
}

// Export writes every archived event in the range as one JSON object per
// line and returns how many it wrote. An entry that does not decode is one
// line of type "undecodable" with the error, so a damaged record is visible
// rather than silently skipped.
func (d *DataDir) Export(ctx context.Context, w io.Writer, opts ExportOptions) (int, error) {
	bw := bufio.NewWriterSize(w, 256<<10)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	n := 0
	if opts.Progress != nil {
		first, _ := d.archive.FirstIndex()
		last, _ := d.archive.LastIndex()
		lo, hi := max(first, opts.From), last
		if opts.To != 0 {
			hi = min(hi, opts.To)
		}
		opts.Progress.Start(span(lo, hi))
	}
	base := max(opts.From, 1)
	err := d.archive.Range(opts.From, opts.To, func(r archive.Record) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		evs := recordEvents(r)
		for i := range evs {
			if err := enc.Encode(&evs[i]); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			n++
		}
		if opts.Progress != nil {
			opts.Progress.Update(span(base, r.Index))
		}
		return nil
	})
	if opts.Progress != nil {
		opts.Progress.Done()
	}
	if err != nil {
		return n, fmt.Errorf("audit: export: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return n, fmt.Errorf("audit: export: write: %w", err)
	}
	return n, nil
}

func span(lo, hi uint64) uint64 {
	if hi < lo {
		return 0
	}
	return hi - lo
}

// recordEvents turns one archive record into exported events.
func recordEvents(r archive.Record) []ExportedEvent {
	t := logTime(r.Time).Format(time.RFC3339Nano)
	props, err := fsm.DecodeEntry(r.Data)
	if err != nil {
		return []ExportedEvent{{Index: r.Index, Time: t, Type: "undecodable", Fields: struct{}{},
			Effects: EffectsJSON{Status: "unknown", Evicted: []EvictedJSON{}}, Error: err.Error()}}
	}
	out := make([]ExportedEvent, len(props))
	for i, p := range props {
		ev := ExportedEvent{Index: r.Index, Time: t, Proposal: i, Type: p.Type.String(), Fields: fsm.Describe(p)}
		if p.ID != (fsm.ProposalID{}) {
			ev.ProposalID = hex.EncodeToString(p.ID[:])
		}
		ev.Effects = EffectsJSON{Status: "not recorded", Evicted: []EvictedJSON{}}
		if i < len(r.Outcomes) {
			o := r.Outcomes[i]
			ev.Effects = EffectsJSON{Status: o.Status.String(), Reason: o.Reason, Evicted: evictedJSON(o.Evicted)}
		}
		out[i] = ev
	}
	return out
}
