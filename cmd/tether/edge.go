package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
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
	configPath := fs.String("config", "", "path to the edge's YAML configuration (required)")
	port := fs.Int("port", -1, "override port (0 picks a free port)")
	hostname := fs.String("hostname", "", "override hostname (listen address)")
	nodeID := fs.String("node-id", "", "override cluster.node_id")
	dataDir := fs.String("data-dir", "", "override cluster.data_dir")
	bindAddr := fs.String("raft-addr", "", "override cluster.bind_addr (Raft and forwarding)")
	advertiseAddr := fs.String("advertise-addr", "", "override cluster.advertise_addr (e.g. $(POD_IP):7400 for a non-voter Deployment pod)")
	natsURL := fs.String("nats", "", "override nats.urls (comma-separated URLs)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *configPath == "" {
		return fmt.Errorf("%w: --config is required", errUsage)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("%w: --log-level: %v", errUsage, err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	cfg, err := edge.LoadConfig(*configPath)
	if err != nil {
		return err
	}
	overridden := false
	if *port >= 0 {
		cfg.Port, overridden = *port, true
	}
	if *hostname != "" {
		cfg.Hostname, overridden = *hostname, true
	}
	if *nodeID != "" {
		cfg.Cluster.NodeID, overridden = *nodeID, true
	}
	if *advertiseAddr != "" {
		cfg.Cluster.AdvertiseAddr, overridden = *advertiseAddr, true
	}
	if *dataDir != "" {
		cfg.Cluster.DataDir, overridden = *dataDir, true
	}
	if *bindAddr != "" {
		cfg.Cluster.BindAddr, overridden = *bindAddr, true
	}
	if *natsURL != "" {
		cfg.NATS.URLs, cfg.NATS.Embedded = nil, false
		for _, u := range strings.Split(*natsURL, ",") {
			if u = strings.TrimSpace(u); u != "" {
				cfg.NATS.URLs = append(cfg.NATS.URLs, u)
			}
		}
		overridden = true
	}
	if overridden {
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("config %s with flags: %w", *configPath, err)
		}
	}

	e, err := edge.New(cfg, edge.Deps{Logger: log, Version: version})
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err = e.Start(sctx)
	cancel()
	if err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return errors.Join(err, e.Close(cctx))
	}
	fmt.Fprintf(os.Stderr, "tether edge %s listening on http://%s (raft %s)\n", cfg.Cluster.NodeID, e.Addr(), e.Node().Addr())
	select {
	case <-ctx.Done():
	case ferr := <-e.Node().Fatal():
		// The node stopped applying the log (an unknown required event,
		// removal from the cluster): serving from a frozen state would
		// route by stale bindings.
		log.Error("cluster node halted; shutting down", "err", ferr)
		cctx, cancel := context.WithTimeout(context.Background(), edgeShutdownGrace)
		defer cancel()
		return errors.Join(fmt.Errorf("edge: cluster node halted: %w", ferr), e.Close(cctx))
	}
	log.Info("shutting down", "grace", edgeShutdownGrace)
	cctx, cancel := context.WithTimeout(context.Background(), edgeShutdownGrace)
	defer cancel()
	return e.Close(cctx)
}
