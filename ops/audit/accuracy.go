package audit

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tether-project/tether/cluster/archive"
	"github.com/tether-project/tether/fsm"
)

// AnswersOptions select the engines' answers read from the log.
type AnswersOptions struct {
	// Since and Until bound the answers by their own time (the answering
	// edge's clock; zero: unbounded), Until exclusive.
	Since, Until time.Time
	Progress     Progress
}

// LoggedAnswer is one engine's answer as an edge recorded it
// (fsm.CacheAnswers).
type LoggedAnswer struct {
	Edge string
	fsm.CacheAnswer
}

// At is the answer's time.
func (a *LoggedAnswer) At() time.Time { return time.UnixMilli(a.AtUnixMilli).UTC() }

// AnswerLog is what the log holds for grading and replaying placements:
// the engines' answers in the window, in log order, and the sub-agent
// links (child conversation → parent).
type AnswerLog struct {
	Answers []LoggedAnswer
	Links   map[string]string
}

// Answers reads the archive's CacheAnswers and Link events.
func (d *DataDir) Answers(ctx context.Context, opts AnswersOptions) (*AnswerLog, error) {
	out := &AnswerLog{Links: map[string]string{}}
	if opts.Progress != nil {
		first, _ := d.archive.FirstIndex()
		last, _ := d.archive.LastIndex()
		opts.Progress.Start(span(first, last))
		defer opts.Progress.Done()
	}
	first, _ := d.archive.FirstIndex()
	err := d.archive.Range(0, 0, func(r archive.Record) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if opts.Progress != nil {
			opts.Progress.Update(span(first, r.Index))
		}
		props, err := fsm.DecodeEntry(r.Data)
		if err != nil {
			return nil // export shows it; grading skips it
		}
		for _, p := range props {
			switch ev := p.Event.(type) {
			case fsm.CacheAnswers:
				for _, a := range ev.Answers {
					if opts.inWindow(a.AtUnixMilli) {
						out.Answers = append(out.Answers, LoggedAnswer{Edge: ev.Edge, CacheAnswer: a})
					}
				}
			case fsm.Link:
				if _, ok := out.Links[ev.Child]; !ok {
					out.Links[ev.Child] = ev.Parent
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("audit: answers: %w", err)
	}
	return out, nil
}

func (o AnswersOptions) inWindow(ms int64) bool {
	t := time.UnixMilli(ms)
	return (o.Since.IsZero() || !t.Before(o.Since)) && (o.Until.IsZero() || t.Before(o.Until))
}

// AccuracyRow grades the KV index's claims for one instance (or, with
// Instance "*", every instance of a source) against the engines' answers.
type AccuracyRow struct {
	Fleet    string `json:"fleet"`
	Instance string `json:"instance"`
	Source   string `json:"source"`
	Answers  int    `json:"answers"`
	// WithinOneBlock: share of the answers whose claim was within one
	// block of the engine's cached tokens; MeanAbsErrorBlocks their mean
	// absolute error in blocks.
	WithinOneBlock     float64 `json:"within_one_block"`
	MeanAbsErrorBlocks float64 `json:"mean_abs_error_blocks"`
	// Claims: answers the index claimed at least one block for;
	// ConfirmedClaims: the engine held the claim less at most one block
	// (the breaker's index rule reads these).
	Claims          int `json:"claims"`
	ConfirmedClaims int `json:"confirmed_claims"`
	// Missed: the engine held more than a block beyond the claim (cache
	// the index did not know of).
	Missed int `json:"missed"`
	// PredictedHitRate: claimed over prompt tokens; HitRate: the engines'
	// cached over prompt tokens.
	PredictedHitRate float64 `json:"predicted_hit_rate"`
	HitRate          float64 `json:"hit_rate"`

	prompt, predicted, cached, errMilli int64
}

// AccuracyReport is `tether audit accuracy`'s answer.
type AccuracyReport struct {
	// First and Last are the window's first and last answers.
	First   time.Time     `json:"first"`
	Last    time.Time     `json:"last"`
	Answers int           `json:"answers"`
	Edges   []string      `json:"edges"`
	Rows    []AccuracyRow `json:"rows"`
}

// Accuracy grades the index per instance and per source from the log's
// answers in the window.
func (d *DataDir) Accuracy(ctx context.Context, opts AnswersOptions) (*AccuracyReport, error) {
	log, err := d.Answers(ctx, opts)
	if err != nil {
		return nil, err
	}
	return GradeAnswers(log.Answers), nil
}

// GradeAnswers computes the report from answers.
func GradeAnswers(answers []LoggedAnswer) *AccuracyReport {
	rep := &AccuracyReport{Edges: []string{}, Rows: []AccuracyRow{}}
	type key struct{ fleet, instance, source string }
	rows := map[key]*AccuracyRow{}
	edges := map[string]bool{}
	add := func(k key, a *LoggedAnswer) {
		r := rows[k]
		if r == nil {
			r = &AccuracyRow{Fleet: k.fleet, Instance: k.instance, Source: k.source}
			rows[k] = r
		}
		r.add(a)
	}
	for i := range answers {
		a := &answers[i]
		if a.BlockSize == 0 {
			continue
		}
		if at := a.At(); rep.Answers == 0 || at.Before(rep.First) {
			rep.First = at
		}
		if at := a.At(); at.After(rep.Last) {
			rep.Last = at
		}
		rep.Answers++
		edges[a.Edge] = true
		add(key{a.Fleet.String(), a.Instance, a.Source.String()}, a)
		add(key{a.Fleet.String(), "*", a.Source.String()}, a)
	}
	for e := range edges {
		rep.Edges = append(rep.Edges, e)
	}
	slices.Sort(rep.Edges)
	for _, r := range rows {
		r.finish()
		rep.Rows = append(rep.Rows, *r)
	}
	slices.SortFunc(rep.Rows, func(a, b AccuracyRow) int {
		return strings.Compare(a.Fleet+"\x00"+a.Source+"\x00"+star(a.Instance), b.Fleet+"\x00"+b.Source+"\x00"+star(b.Instance))
	})
	return rep
}

// star sorts a source's total after its instances.
func star(instance string) string {
	if instance == "*" {
		return "\xff"
	}
	return instance
}

func (r *AccuracyRow) add(a *LoggedAnswer) {
	bs := int64(a.BlockSize)
	pred, cached := int64(a.PredictedTokens), int64(a.CachedTokens)
	diff := pred - cached
	if diff < 0 {
		diff = -diff
	}
	r.Answers++
	if diff <= bs {
		r.WithinOneBlock++
	}
	r.errMilli += diff * 1000 / bs
	if pred >= bs {
		r.Claims++
		if cached >= pred-bs {
			r.ConfirmedClaims++
		}
	}
	if cached > pred+bs {
		r.Missed++
	}
	r.prompt += int64(a.PromptTokens)
	r.predicted += min(pred, int64(a.PromptTokens))
	r.cached += cached
}

func (r *AccuracyRow) finish() {
	if r.Answers > 0 {
		r.MeanAbsErrorBlocks = float64(r.errMilli) / 1000 / float64(r.Answers)
		r.WithinOneBlock /= float64(r.Answers)
	}
	if r.prompt > 0 {
		r.PredictedHitRate = float64(r.predicted) / float64(r.prompt)
		r.HitRate = float64(r.cached) / float64(r.prompt)
	}
}

// WriteText prints the report as a table.
func (rep *AccuracyReport) WriteText(w io.Writer) error {
	if rep.Answers == 0 {
		_, err := fmt.Fprintln(w, "no engine answers in the log (CacheAnswers): no request was placed by a KV-aware router in the window, or the edges predate grading")
		return err
	}
	fmt.Fprintf(w, "%d answers from %s to %s, recorded by %s\n\n", rep.Answers, rep.First.Format(time.RFC3339), rep.Last.Format(time.RFC3339),
		strings.Join(rep.Edges, ", "))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FLEET\tINSTANCE\tSOURCE\tANSWERS\tWITHIN 1 BLOCK\tMAE (BLOCKS)\tCLAIMS CONFIRMED\tMISSED\tPREDICTED HIT\tENGINE HIT")
	for _, r := range rep.Rows {
		conf := "-"
		if r.Claims > 0 {
			conf = fmt.Sprintf("%d/%d (%.1f%%)", r.ConfirmedClaims, r.Claims, 100*float64(r.ConfirmedClaims)/float64(r.Claims))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.1f%%\t%.2f\t%s\t%d\t%.1f%%\t%.1f%%\n", r.Fleet, r.Instance, r.Source, r.Answers,
			100*r.WithinOneBlock, r.MeanAbsErrorBlocks, conf, r.Missed, 100*r.PredictedHitRate, 100*r.HitRate)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "\n(instance * is the source's total; a claim is confirmed when the engine held it less at most one block: fewer than half confirmed among an instance's last claims degrades it, circuit_breaker.index_*)")
	return err
}
