package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/tether-project/tether/edge"
)

func init() {
	register("edge", "run an edge: the OpenAI-compatible front door over the replicated affinity log", runEdge)
}

// edgeShutdownGrace bounds the shutdown after SIGINT/SIGTERM: in-flight
// requests finish, the last touches and degraded placements are flushed,
// leadership is handed over.
const edgeShutdownGrace = 30 * time.Second

func runEdge(ctx context.Context, args []string) error {
	fs := newFlagSet("edge")
	df := addDaemonFlags(fs, "nats.urls")
	nodeID := fs.String("node-id", "", "override cluster.node_id")
	dataDir := fs.String("data-dir", "", "override cluster.data_dir")
	bindAddr := fs.String("raft-addr", "", "override cluster.bind_addr (Raft and forwarding)")
	advertiseAddr := fs.String("advertise-addr", "", "override cluster.advertise_addr (e.g. $(POD_IP):7400 for a non-voter Deployment pod)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := df.logger()
	if err != nil {
		return err
	}
	// Validated once the flags are in: a file may leave to them what they
	// set (a StatefulSet's --node-id and --advertise-addr).
	cfg, err := edge.ReadConfig(*df.config)
	if err != nil {
		return err
	}
	withFlags := applyOverrides([]override{
		{*df.port >= 0, func() { cfg.Port = *df.port }},
		{*df.hostname != "", func() { cfg.Hostname = *df.hostname }},
		{*nodeID != "", func() { cfg.Cluster.NodeID = *nodeID }},
		{*advertiseAddr != "", func() { cfg.Cluster.AdvertiseAddr = *advertiseAddr }},
		{*dataDir != "", func() { cfg.Cluster.DataDir = *dataDir }},
		{*bindAddr != "", func() { cfg.Cluster.BindAddr = *bindAddr }},
		{*df.nats != "", func() { cfg.NATS.URLs, cfg.NATS.Embedded = df.natsURLs(), false }},
	})
	if err := cfg.Validate(); err != nil {
		if withFlags {
			return fmt.Errorf("config %s with flags: %w", *df.config, err)
		}
		return fmt.Errorf("config %s: %w", *df.config, err)
	}
	e, err := edge.New(cfg, edge.Deps{Logger: log, Version: version})
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err = e.Start(sctx)
	cancel()
	if err != nil {
		return errors.Join(err, closeWithin(5*time.Second, e.Close))
	}
	fmt.Fprintf(os.Stderr, "tether edge %s listening on http://%s (raft %s)\n", cfg.Cluster.NodeID, e.Addr(), e.Node().Addr())
	select {
	case <-ctx.Done():
	case ferr := <-e.Node().Fatal():
		// The node stopped applying the log (an unknown required event,
		// removal from the cluster): serving from a frozen state would
		// route by stale bindings.
		log.Error("cluster node halted; shutting down", "err", ferr)
		return errors.Join(fmt.Errorf("edge: cluster node halted: %w", ferr), closeWithin(edgeShutdownGrace, e.Close))
	}
	log.Info("shutting down", "grace", edgeShutdownGrace)
	return closeWithin(edgeShutdownGrace, e.Close)
}
