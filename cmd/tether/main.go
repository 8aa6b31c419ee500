// Command tether is the single binary of the tether control plane: edges,
// workers, the local development deployment, audit and operator tools.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
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

func usage() {
	fmt.Fprintln(os.Stderr, "usage: tether <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(os.Stderr, "\nRun 'tether <command> -h' for the flags of a command.")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "tether: unknown command %q\n\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	// SIGHUP (the terminal closed) and SIGPIPE (stdout piped to a reader
	// that went away, as `make run | tee log` after Ctrl-C) stop like
	// SIGINT: a drain and a clean exit. Without notifying SIGPIPE, the Go
	// runtime kills the process on a write to a closed stdout, skipping
	// the shutdown and leaving tether dev's temporary directory (CA key
	// included) behind.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	defer stop()
	if err := cmd.run(ctx, os.Args[2:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintf(os.Stderr, "tether %s: %v\n", os.Args[1], err)
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
	if err := fs.Parse(args); err != nil {
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

func init() {
	register("version", "print the version and the highest event schema this build understands", func(ctx context.Context, args []string) error {
		fs := newFlagSet("version")
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		fmt.Printf("tether %s\n", version)
		return nil
	})
}

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"
