// Command tether-bench builds the benchmark report: it runs everything
// BENCHMARKS.md publishes and rewrites its generated sections and the plots
// in docs/bench. It is a binary of its own so that the production tether
// binary does not link the plotting stack (gonum/plot, fonts, LaTeX, PDF);
// `make bench-report` runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/tether-project/tether/ops/bench"
	"github.com/tether-project/tether/ops/bench/plots"
)

const usage = `usage: tether-bench report --traces DIR [flags]

Runs every benchmark BENCHMARKS.md publishes and rewrites its generated
sections and the plots. Run 'tether-bench report -h' for the flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	args := os.Args[1:]
	if len(args) == 0 || args[0] != "report" {
		fmt.Fprint(os.Stderr, usage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			return
		}
		os.Exit(2)
	}
	if err := report(ctx, args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "tether-bench:", err)
		os.Exit(1)
	}
}

func report(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tether-bench report", flag.ContinueOnError)
	traces := fs.String("traces", "", "directory of trace files (required)")
	markdown := fs.String("markdown", "BENCHMARKS.md", "markdown file whose generated sections are rewritten (\"\" = print them)")
	plotDir := fs.String("plots", "docs/bench", "directory for the PNG plots")
	micro := fs.String("micro", "", "go test -bench output to publish as the micro-benchmark table")
	seeds := fs.String("seeds", "1,2,3,4,5", "seeds; figures are medians over them")
	logKind := fs.String("log", "virtual", "affinity log: virtual or sequencer")
	parallel := fs.Int("parallel", 0, "concurrent runs (0: one per CPU)")
	e2e := fs.Bool("e2e", true, "also replay a subset of the traces against local deployments (one per policy) and compare the ranking with sim mode")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *traces == "" {
		return errors.New("--traces is required")
	}
	lk, err := bench.ParseLogKind(*logKind)
	if err != nil {
		return err
	}
	var seedList []uint64
	for _, f := range strings.Split(*seeds, ",") {
		s, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return fmt.Errorf("--seeds: %q is not a seed", f)
		}
		seedList = append(seedList, s)
	}
	link := *plotDir
	if *markdown != "" {
		if rel, err := filepath.Rel(filepath.Dir(*markdown), *plotDir); err == nil {
			link = filepath.ToSlash(rel)
		}
	}
	sec, err := bench.BuildReport(ctx, bench.ReportOptions{
		Traces: *traces, PlotDir: *plotDir, Plotter: plots.Plotter{}, PlotLink: link, MicroFile: *micro, Seeds: seedList,
		Log: lk, Parallel: *parallel, Progress: os.Stderr, Command: "make bench-report",
		Module: "github.com/tether-project/tether", E2E: *e2e,
	})
	if err != nil {
		return err
	}
	if *markdown == "" {
		for _, name := range []string{"machine", "targets", "policy-comparison", "agents", "micro"} {
			if s, ok := sec[name]; ok {
				fmt.Printf("<!-- %s -->\n%s\n", name, s)
			}
		}
		return nil
	}
	if err := bench.RewriteSections(*markdown, sec); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "rewrote %s and the plots in %s\n", *markdown, *plotDir)
	return nil
}
