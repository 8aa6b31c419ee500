package main

import (
	"context"
	"encoding/json"
	"errors"
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
	"github.com/tether-project/tether/ops/operator"
)

func init() {
	register("audit", "offline audit of a COPY of an edge's data dir: replay, explain KEY, verify against a live edge, export, accuracy, tune", runAudit)
}

const auditUsage = `usage: tether audit <subcommand> --data-dir DIR [flags]

subcommands:
  replay   rebuild the state into a throwaway machine; print the state hash, the index reached and a summary
           [--until-index N | --until-time RFC3339] [--json]
  explain  the full history of one routing key and the sub-agents linked to it
           --key KEY [--fleet context|generation] [--no-children] [--json]
           or which instance holds a stored Responses API response and why
           --response ID [--model M] [--json] (authenticated with $TETHER_INTERNAL_REQUEST_AUTH_KEY when set)
  verify   replay and compare with a live edge's state hash (exit 1 on mismatch)
           --edge URL [--admin-token T | $TETHER_ADMIN_TOKEN] [--spot-check N] [--cacert CA.pem [--cert C --key K]]
  export   one JSON object per event for external tools
           --format ndjson [--from N] [--to N] [--out FILE]
  accuracy the KV index's claims graded against the engines' cached tokens, per instance and per source
           [--since RFC3339] [--until RFC3339] [--json]
  tune     the log's requests replayed in the simulator under other weights and thresholds, ranked
           [--set key=v1,v2 ...] [--config edge.yaml] [--fleet context|generation] [--since/--until]
           [--capacity-blocks N] [--ranks N] [--time-scale X] [--output-tokens N] [--max-requests N] [--json]

Audit reads a COPY of the data directory: a running edge holds its files locked
(cp -r the directory, or take 'tether operator snapshot save' for the state alone).
`

// errNotFound marks a query about something the data holds nothing about
// (exit 1).
var errNotFound = errors.New("not found")

// errVerifyFailed marks a completed verification that found a mismatch.
var errVerifyFailed = errors.New("verification failed")

// auditRun runs one audit subcommand on the opened data directory once its
// flags are parsed, writing its answer to out.
type auditRun func(ctx context.Context, d *audit.DataDir, out io.Writer, asJSON bool) error

// auditCommands registers each audit subcommand: the function adds the
// subcommand's own flags to fs and returns the step that runs it.
var auditCommands = map[string]func(fs *flag.FlagSet) auditRun{
	"replay":   auditReplay,
	"explain":  auditExplain,
	"verify":   auditVerify,
	"export":   auditExport,
	"accuracy": auditAccuracy,
	"tune":     auditTune,
}

func runAudit(ctx context.Context, args []string) error {
	if done, err := groupUsage(args, auditUsage, "a subcommand is required"); done {
		return err
	}
	sub, rest := args[0], args[1:]
	fs := newFlagSet("audit " + sub)
	fs.Usage = func() { fmt.Fprint(fs.Output(), auditUsage) }
	dataDir := fs.String("data-dir", "", "a COPY of an edge's cluster.data_dir (required)")
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	noRaft := fs.Bool("no-raft-log", false, "ignore raft.db (archive and snapshots only)")
	lockTimeout := fs.Duration("lock-timeout", audit.DefaultLockTimeout, "how long to wait for a file lock before concluding a node is running on the directory")
	command, ok := auditCommands[sub]
	if !ok {
		fmt.Fprint(os.Stderr, auditUsage)
		return fmt.Errorf("%w: unknown audit subcommand %q", errUsage, sub)
	}
	run := command(fs)
	if err := parseFlags(fs, rest); err != nil {
		return err
	}
	if *dataDir == "" {
		return fmt.Errorf("%w: --data-dir is required", errUsage)
	}
	d, err := audit.Open(*dataDir, audit.Options{LockTimeout: *lockTimeout, NoRaftLog: *noRaft})
	if err != nil {
		return err
	}
	defer d.Close()
	return run(ctx, d, os.Stdout, *asJSON)
}

// auditReplay is "audit replay": the state rebuilt up to an index or a log
// time, and its summary.
func auditReplay(fs *flag.FlagSet) auditRun {
	untilIndex := fs.Uint64("until-index", 0, "stop after this log index")
	untilTime := fs.String("until-time", "", "stop before the first entry after this log time (RFC 3339)")
	return func(ctx context.Context, d *audit.DataDir, out io.Writer, asJSON bool) error {
		opts := audit.ReplayOptions{UntilIndex: *untilIndex, Progress: progress.New(os.Stderr, "replay")}
		if *untilTime != "" {
			if *untilIndex != 0 {
				return fmt.Errorf("%w: --until-index and --until-time are exclusive", errUsage)
			}
			t, err := time.Parse(time.RFC3339Nano, *untilTime)
			if err != nil {
				return fmt.Errorf("%w: --until-time %q: want RFC 3339, e.g. 2025-03-01T12:00:00Z: %v", errUsage, *untilTime, err)
			}
			opts.UntilTime = t
		}
		res, err := d.Replay(ctx, opts)
		if err != nil {
			return err
		}
		return printReplay(out, res, asJSON)
	}
}

// auditExplain is "audit explain": one routing key's history (--key) or
// where a stored response lives (--response).
func auditExplain(fs *flag.FlagSet) auditRun {
	key := fs.String("key", "", "the routing key (a conversation id or a parent's root key; this or --response)")
	response := fs.String("response", "", "a Responses API id an edge minted: which instance holds it and why")
	fleet := fs.String("fleet", "", "context or generation (default: both)")
	noChildren := fs.Bool("no-children", false, "skip the scan for linked sub-agents")
	model := fs.String("model", "", "a model other than the edge's first (its keys are in the model's namespace; default: the first model)")
	return func(ctx context.Context, d *audit.DataDir, out io.Writer, asJSON bool) error {
		if (*key == "") == (*response == "") {
			return fmt.Errorf("%w: give one of --key or --response", errUsage)
		}
		if *response != "" {
			return explainResponse(ctx, d, out, *response, *model, asJSON)
		}
		opts := audit.ExplainOptions{NoChildren: *noChildren, Model: *model}
		if *fleet != "" {
			f, err := fsm.ParseFleet(*fleet)
			if err != nil {
				return fmt.Errorf("%w: --fleet: %v", errUsage, err)
			}
			opts.Fleets = []fsm.Fleet{f}
		}
		ex, err := d.Explain(ctx, *key, opts)
		if err != nil {
			return err
		}
		if asJSON {
			err = writeJSONTo(out, ex)
		} else {
			err = ex.WriteText(out)
		}
		if err == nil && !ex.Found() {
			err = fmt.Errorf("%w: key %q: nothing in this data directory's log (no bind, touch, overflow, eviction or linked sub-agent); check the key and --fleet", errNotFound, *key)
		}
		return err
	}
}

// explainResponse answers "audit explain --response": which instance holds
// the stored response and why, authenticated with the internal request key
// when the environment sets one.
func explainResponse(ctx context.Context, d *audit.DataDir, out io.Writer, response, model string, asJSON bool) error {
	var k []byte
	if v := os.Getenv(edge.EnvInternalRequestAuthKey); v != "" {
		k = []byte(v)
	}
	ex, err := d.ExplainResponse(ctx, response, k, model)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSONTo(out, ex)
	}
	return ex.WriteText(out)
}

// auditVerify is "audit verify": the replayed state compared with a live
// edge's.
func auditVerify(fs *flag.FlagSet) auditRun {
	edgeURL := fs.String("edge", "", "the live edge's base URL, e.g. http://10.0.0.1:8000 (required)")
	token := fs.String("admin-token", "", "admin API bearer token (default $"+operator.EnvAdminToken+")")
	tlsFlags := addAdminTLSFlags(fs)
	spot := fs.Int("spot-check", 1000, "bindings compared one by one when the edge moved past the copy")
	return func(ctx context.Context, d *audit.DataDir, out io.Writer, asJSON bool) error {
		if *edgeURL == "" {
			return fmt.Errorf("%w: --edge is required", errUsage)
		}
		c, err := tlsFlags.adminClient([]string{*edgeURL}, *token)
		if err != nil {
			return err
		}
		defer c.Close()
		rep, err := audit.Verify(ctx, d, c, audit.VerifyOptions{SpotCheck: *spot, Replay: audit.ReplayOptions{Progress: progress.New(os.Stderr, "replay")}})
		if err != nil {
			return err
		}
		if err := printVerify(out, rep, asJSON); err != nil {
			return err
		}
		if !rep.OK {
			return fmt.Errorf("%w: %s", errVerifyFailed, rep.Message)
		}
		return nil
	}
}

// printVerify writes a verification's report: a JSON object, or its notes
// and its message.
func printVerify(out io.Writer, rep *audit.VerifyReport, asJSON bool) error {
	if asJSON {
		return writeJSONTo(out, struct {
			OK         bool     `json:"ok"`
			Mode       string   `json:"mode"`
			Index      uint64   `json:"index"`
			ReplayHash string   `json:"replay_hash"`
			LiveIndex  uint64   `json:"live_index"`
			LiveHash   string   `json:"live_hash"`
			NodeID     string   `json:"node_id"`
			Message    string   `json:"message"`
			Notes      []string `json:"notes"`
		}{rep.OK, rep.Mode, rep.Index, rep.ReplayHash, rep.LiveIndex, rep.LiveHash, rep.NodeID, rep.Message, rep.Replay.Notes})
	}
	for _, n := range rep.Replay.Notes {
		fmt.Fprintf(out, "note: %s\n", n)
	}
	fmt.Fprintln(out, rep.Message)
	return nil
}

// auditExport is "audit export": one JSON object per event, to standard
// output or a file.
func auditExport(fs *flag.FlagSet) auditRun {
	format := fs.String("format", "ndjson", "output format (ndjson)")
	from := fs.Uint64("from", 0, "first log index")
	to := fs.Uint64("to", 0, "last log index (0: the end)")
	out := fs.String("out", "", "write to this file instead of standard output")
	return func(ctx context.Context, d *audit.DataDir, stdout io.Writer, _ bool) error {
		if *format != "ndjson" {
			return fmt.Errorf("%w: --format %q: only ndjson is supported", errUsage, *format)
		}
		w := stdout
		if *out != "" {
			f, err := os.Create(*out)
			if err != nil {
				return err
			}
			defer f.Close()
			w = f
		}
		n, err := d.Export(ctx, w, audit.ExportOptions{From: *from, To: *to, Progress: progress.New(os.Stderr, "export")})
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "exported %d events\n", n)
		return nil
	}
}

func printReplay(w io.Writer, res *audit.Result, asJSON bool) error {
	s := audit.Summarize(res.State)
	if asJSON {
		return writeJSONTo(w, struct {
			Start         string                  `json:"start"`
			Notes         []string                `json:"notes"`
			FromArchive   int                     `json:"entries_from_archive"`
			FromRaftLog   int                     `json:"entries_from_raft_log"`
			Events        int                     `json:"events"`
			MismatchCount int                     `json:"outcome_mismatches"`
			Mismatches    []audit.OutcomeMismatch `json:"first_mismatches"`
			Summary       audit.Summary           `json:"summary"`
		}{res.Start.String(), res.Notes, res.FromArchive, res.FromRaftLog, res.Events, res.MismatchCount, res.Mismatches, s})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "replayed from %s: %d entries from the archive, %d from raft.db, %d events\n", res.Start, res.FromArchive, res.FromRaftLog, res.Events)
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	if res.MismatchCount > 0 {
		fmt.Fprintf(&b, "WARNING: %d archived outcomes differ from the replay's:\n", res.MismatchCount)
		for _, m := range res.Mismatches {
			fmt.Fprintf(&b, "  %s\n", m)
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	return s.WriteText(w)
}

func writeJSONTo(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// parseInterspersed parses flags that may come before, between or after
// positional arguments, and returns the positionals.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseHelpful(fs, args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}
