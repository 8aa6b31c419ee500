// Command tether is the single binary of the tether control plane: edges,
// workers, the local development deployment, audit and operator tools.
package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"

	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/telemetry"
)

// command is one subcommand. run receives the arguments after the
// subcommand name and a context cancelled on SIGINT/SIGTERM.
type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
}

// commands is filled by the init functions of the files beside this one,
// one file per subcommand, so parts can land independently.
var commands = map[string]command{}

func register(name, summary string, run func(ctx context.Context, args []string) error) {
	if _, dup := commands[name]; dup {
		panic("tether: duplicate command " + name)
	}
	commands[name] = command{summary: summary, run: run}
}

// errUsage marks errors caused by bad arguments: exit code 2.
var errUsage = errors.New("usage error")

// usage lists the commands on w: standard output when asked for (-h,
// help), standard error after a mistake.
func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: tether <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'tether <command> -h' for the flags of a command.")
}

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "-version" || os.Args[1] == "-v") {
		printVersion(os.Stdout)
		return
	}
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		if len(os.Args) < 2 {
			usage(os.Stderr)
			os.Exit(2)
		}
		usage(os.Stdout)
		return
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "tether: unknown command %q\n\n", os.Args[1])
		usage(os.Stderr)
		os.Exit(2)
	}
	ctx, stop := stopOnSignals(context.Background())
	defer stop()
	if err := cmd.run(ctx, os.Args[2:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintf(os.Stderr, "tether %s: %s\n", os.Args[1], explain(os.Args[1], err))
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// newFlagSet returns a flag set that reports errors instead of exiting, so
// every subcommand handles bad flags the same way.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("tether "+name, flag.ContinueOnError)
	return fs
}

// parseFlags parses args and wraps parse failures as usage errors.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := parseHelpful(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	return nil
}

// parseHelpful is fs.Parse with what it prints sent where a user looks for
// it: the usage asked for with -h on standard output, a mistake and the
// usage after it on standard error.
func parseHelpful(fs *flag.FlagSet, args []string) error {
	out := fs.Output()
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	err := fs.Parse(args)
	fs.SetOutput(out)
	if errors.Is(err, flag.ErrHelp) {
		out = os.Stdout
	}
	out.Write(buf.Bytes())
	return err
}

// groupUsage answers a command group (audit, operator, bench) called
// without its command (usage on standard error, a usage error saying what
// is missing) or with a help argument (usage on standard output); done
// reports that it answered.
func groupUsage(args []string, usage, missing string) (done bool, err error) {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return true, fmt.Errorf("%w: %s", errUsage, missing)
	}
	if helpArg(args[0]) {
		fmt.Fprint(os.Stdout, usage)
		return true, nil
	}
	return false, nil
}

// helpArg reports whether arg asks for help.
func helpArg(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "--h", "help":
		return true
	}
	return false
}

func init() {
	register("version", "print the version, commit, event schema and feature levels of this build", func(ctx context.Context, args []string) error {
		fs := newFlagSet("version")
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		printVersion(os.Stdout)
		return nil
	})
}

// printVersion writes what a build is: its version, the commit it was
// built from (Go's VCS stamp), the event schema it writes and the feature
// levels it understands (a cluster runs at the lowest of its voters').
func printVersion(w io.Writer) {
	commit, when, modified, goVersion := "unknown", "", false, runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if modified {
		commit += " (modified)"
	}
	if when != "" {
		commit += " " + when
	}
	fmt.Fprintf(w, "tether %s\n", version)
	fmt.Fprintf(w, "commit:          %s\n", commit)
	fmt.Fprintf(w, "go:              %s\n", goVersion)
	fmt.Fprintf(w, "event schema:    %d (affinity-log event payloads)\n", fsm.EventPayloadVersion)
	fmt.Fprintf(w, "feature levels:  %d..%d (the highest this build understands; fsm/DESIGN.md)\n", fsm.FeatureLevelBase, fsm.FeatureLevelMax)
	fmt.Fprintf(w, "telemetry level: %d (worker reports)\n", telemetry.FeatureLevel)
}

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

// explain is an error as printed after "tether <command>: ": without the
// command's own prefix repeated, and with the fix when one is known.
func explain(cmd string, err error) string {
	msg := err.Error()
	for strings.HasPrefix(msg, cmd+": ") {
		msg = strings.TrimPrefix(msg, cmd+": ")
	}
	msg = strings.ReplaceAll(msg, ": "+cmd+": ", ": ")
	var unknownCA x509.UnknownAuthorityError
	if errors.As(err, &unknownCA) {
		msg += "\n  the edge's certificate is signed by a CA this client does not trust: pass --cacert <ca.pem> (tether dev prints it as \"ca cert:\")"
	}
	return msg
}
