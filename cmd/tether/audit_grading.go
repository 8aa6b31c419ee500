package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/progress"
	"github.com/tether-project/tether/ops/audit"
	"github.com/tether-project/tether/ops/tune"
	"github.com/tether-project/tether/routing"
)

// windowFlags are --since and --until: the answers' window.
type windowFlags struct{ since, until *string }

func addWindowFlags(fs *flag.FlagSet) windowFlags {
	return windowFlags{
		since: fs.String("since", "", "only answers at or after this time (RFC 3339, the answering edge's clock)"),
		until: fs.String("until", "", "only answers before this time (RFC 3339)"),
	}
}

func (w windowFlags) options() (audit.AnswersOptions, error) {
	var o audit.AnswersOptions
	for _, x := range []struct {
		name string
		v    string
		dst  *time.Time
	}{{"since", *w.since, &o.Since}, {"until", *w.until, &o.Until}} {
		if x.v == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, x.v)
		if err != nil {
			return o, fmt.Errorf("%w: --%s %q: want RFC 3339, e.g. 2025-03-01T12:00:00Z: %v", errUsage, x.name, x.v, err)
		}
		*x.dst = t
	}
	if !o.Since.IsZero() && !o.Until.IsZero() && !o.Until.After(o.Since) {
		return o, fmt.Errorf("%w: --until must be after --since", errUsage)
	}
	return o, nil
}

// auditAccuracy is "audit accuracy": the KV index's claims graded against
// the engines' answers, per instance and per source.
func auditAccuracy(fs *flag.FlagSet) auditRun {
	window := addWindowFlags(fs)
	return func(ctx context.Context, d *audit.DataDir, out io.Writer, asJSON bool) error {
		opts, err := window.options()
		if err != nil {
			return err
		}
		opts.Progress = progress.New(os.Stderr, "read")
		rep, err := d.Accuracy(ctx, opts)
		if err != nil {
			return err
		}
		if asJSON {
			return writeJSONTo(out, rep)
		}
		return rep.WriteText(out)
	}
}

// specs is a repeatable flag whose values are kept whole (commas
// included).
type specs []string

func (s *specs) String() string     { return strings.Join(*s, " ") }
func (s *specs) Set(v string) error { *s = append(*s, v); return nil }

// auditTune is "audit tune": the log's requests replayed under other
// weights and thresholds.
func auditTune(fs *flag.FlagSet) auditRun {
	window := addWindowFlags(fs)
	var sets specs
	fs.Var(&sets, "set", "a candidate setting, key=v1,v2,… (one replay per value; repeatable; default: a grid around the base). Keys: "+strings.Join(tune.Settings(), ", "))
	fleet := fs.String("fleet", "context", "the fleet whose requests to replay")
	configPath := fs.String("config", "", "the edges' configuration file: its placement settings are the base (default: the shipped defaults)")
	capacity := fs.Int("capacity-blocks", 0, "KV blocks per simulated instance (default: the simulated engine's, what tether dev runs)")
	ranks := fs.Int("ranks", 1, "attention-DP ranks per simulated instance")
	outputTokens := fs.Int("output-tokens", 64, "tokens each replayed request generates (the log does not record them)")
	maxRequests := fs.Int("max-requests", 20000, "replay at most this many of the window's earliest requests (0: all)")
	seed := fs.Uint64("seed", 1, "the simulated load balancer's seed")
	timeScale := fs.Float64("time-scale", 1, "multiply the recorded arrival offsets (10 for a tether dev run at --time-scale 0.1: its engines ran ten times faster than the simulator's)")
	return func(ctx context.Context, d *audit.DataDir, out io.Writer, asJSON bool) error {
		opts, err := window.options()
		if err != nil {
			return err
		}
		f, err := fsm.ParseFleet(*fleet)
		if err != nil {
			return fmt.Errorf("%w: --fleet: %v", errUsage, err)
		}
		base, err := tuneBase(*configPath, f)
		if err != nil {
			return err
		}
		var cands []tune.Candidate
		for _, s := range sets {
			cs, err := tune.ParseSet(base, s)
			if err != nil {
				return fmt.Errorf("%w: %v", errUsage, err)
			}
			cands = append(cands, cs...)
		}
		log, err := d.Answers(ctx, opts)
		if err != nil {
			return err
		}
		rec, err := tune.Rebuild(log, f, *outputTokens, *maxRequests)
		if err != nil {
			return err
		}
		if !(*timeScale > 0) {
			return fmt.Errorf("%w: --time-scale must be > 0", errUsage)
		}
		rep, err := tune.Run(ctx, rec, tune.Options{Base: base, Candidates: cands, CapacityBlocks: *capacity, Ranks: *ranks, Seed: *seed, TimeScale: *timeScale,
			Progress: func(done, total int) { fmt.Fprintf(os.Stderr, "replayed %d/%d configurations\n", done, total) }})
		if err != nil {
			return err
		}
		if asJSON {
			return writeJSONTo(out, rep)
		}
		return rep.WriteText(out)
	}
}

// tuneBase is the routing configuration the edges ran on fleet f: the
// configuration file's, or the shipped defaults.
func tuneBase(path string, f fsm.Fleet) (routing.Config, error) {
	if path == "" {
		return routing.DefaultConfig(), nil
	}
	cfg, err := edge.LoadConfig(path)
	if err != nil {
		return routing.Config{}, err
	}
	return cfg.RoutingConfig(f), nil
}
