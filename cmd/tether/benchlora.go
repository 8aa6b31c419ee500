package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/tether-project/tether/ops/bench"
)

// runBenchLoRA is `tether bench lora`: the LoRA benchmark in virtual time
// (ops/bench/lora.go), a Markdown table on standard output.
func runBenchLoRA(ctx context.Context, args []string) error {
	fs := newFlagSet("bench lora")
	types := fs.Int("types", 8, "agent types, each on its own LoRA adapter")
	perType := fs.Int("agents-per-type", 24, "root conversations per type")
	spread := fs.Duration("spread", 60*time.Second, "root conversations start uniformly within this window")
	instances := fs.Int("instances", 8, "simulated instances (one rank each)")
	maxLoRAs := fs.Int("max-loras", 2, "adapter slots per instance (vLLM --max-loras)")
	loadTime := fs.Duration("load-time", 0, "one adapter load (0: the simulated engine's default, 100ms)")
	edges := fs.Int("edges", 3, "edges (the ideal-edge reference always runs one)")
	seeds := fs.Int("seeds", 5, "seeds 1..N: start offsets and the load balancer's choices")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *seeds < 1 || *types < 1 || *perType < 1 || *instances < 1 || *maxLoRAs < 1 || *edges < 1 {
		return fmt.Errorf("%w: --types, --agents-per-type, --instances, --max-loras, --edges and --seeds must be at least 1", errUsage)
	}
	c := bench.LoRABenchConfig{
		Workload:  bench.LoRAOptions{Types: *types, AgentsPerType: *perType, Spread: *spread},
		Instances: *instances, MaxLoRAs: *maxLoRAs, LoadTime: *loadTime, Edges: *edges,
	}
	for s := 1; s <= *seeds; s++ {
		c.Seeds = append(c.Seeds, uint64(s))
	}
	rs, err := bench.RunLoRABench(ctx, c)
	if err != nil {
		return err
	}
	return bench.WriteLoRATable(os.Stdout, c, rs)
}
