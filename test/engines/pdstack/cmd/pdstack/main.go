// Command pdstack runs a local deployment of stand-in engines behind three
// tether edges until it is interrupted, for `tether bench replay --mode e2e
// --edge-urls ... --engine-metrics ...` (BENCHMARKS.md, "Prefill/decode
// disaggregation: prefill work"):
//
//	go run ./test/engines/pdstack/cmd/pdstack -example deploy/vllm-pd/edge.yaml -setup split -env /tmp/pd.env
//
// -setup split runs the example as written (prefill and decode servers),
// aggregated its servers serving whole requests, emulated its servers
// behind tether workers in proxy mode (the emulated disaggregation that
// prefills twice). Once ready it writes EDGE_URLS and ENGINE_METRICS
// (comma-separated) to the -env file.
//
//	go run ./test/engines/pdstack/cmd/pdstack -summarize bin/pdbench-*.json
//
// prints the Markdown table of bench.sh's runs: per setup, medians and
// ranges over the seeds.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/test/engines/pdstack"
)

func main() {
	example := flag.String("example", "deploy/vllm-pd/edge.yaml", "a prefill/decode edge configuration example")
	setup := flag.String("setup", "split", "split, aggregated or emulated")
	envFile := flag.String("env", "", "write EDGE_URLS and ENGINE_METRICS here once ready")
	gpuBlocks := flag.Int("gpu-blocks", 0, "KV blocks per stand-in rank (0: the stand-in's default)")
	summarize := flag.Bool("summarize", false, "print the Markdown table of the bench replay --json files named as arguments (pdbench-<setup>-<seed>.json)")
	flag.Parse()
	if *summarize {
		if err := summary(os.Stdout, flag.Args()); err != nil {
			fmt.Fprintln(os.Stderr, "pdstack:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*example, *setup, *envFile, *gpuBlocks); err != nil {
		fmt.Fprintln(os.Stderr, "pdstack:", err)
		os.Exit(1)
	}
}

func run(example, setup, envFile string, gpuBlocks int) error {
	// A local deployment's secrets: the example leaves them to the
	// environment.
	for k, v := range map[string]string{edge.EnvAdminToken: "pdstack-admin-token-0123456789abcdef",
		edge.EnvClusterAuthKey: "pdstack-cluster-key-0123456789abcdef"} {
		if os.Getenv(k) == "" {
			os.Setenv(k, v)
		}
	}
	b, err := os.ReadFile(example)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o := pdstack.Options{GPUBlocks: gpuBlocks}
	var s *pdstack.Stack
	switch setup {
	case "split":
		s, err = pdstack.StartExample(ctx, string(b), o)
	case "aggregated":
		var agg string
		if agg, err = pdstack.Aggregated(string(b)); err == nil {
			s, err = pdstack.StartExample(ctx, agg, o)
		}
	case "emulated":
		s, err = pdstack.StartEmulated(ctx, string(b), o)
	default:
		return fmt.Errorf("-setup: %q (want split, aggregated or emulated)", setup)
	}
	if err != nil {
		return err
	}
	defer s.Close()
	env := fmt.Sprintf("EDGE_URLS=%s\nENGINE_METRICS=%s\nMODEL=%s\n", strings.Join(s.EdgeURLs(), ","), strings.Join(s.MetricsURLs(), ","), s.Model)
	if envFile != "" {
		if err := os.WriteFile(envFile+".tmp", []byte(env), 0o600); err != nil {
			return err
		}
		if err := os.Rename(envFile+".tmp", envFile); err != nil {
			return err
		}
	}
	fmt.Print(env)
	<-ctx.Done()
	return nil
}
