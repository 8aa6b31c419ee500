package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/tether-project/tether/worker"
)

func init() {
	register("worker", "run a worker: OpenAI-compatible API over a simulated or proxied engine", runWorker)
}

// workerShutdownGrace bounds how long in-flight requests may finish after
// SIGINT/SIGTERM before they are cancelled.
const workerShutdownGrace = 30 * time.Second

func runWorker(ctx context.Context, args []string) error {
	fs := newFlagSet("worker")
	configPath := fs.String("config", "", "path to the worker's YAML configuration (required)")
	port := fs.Int("port", -1, "override port (0 picks a free port)")
	instanceID := fs.String("instance-id", "", "override instance_id")
	natsURL := fs.String("nats", "", "override nats.url (comma-separated URLs)")
	hostname := fs.String("hostname", "", "override hostname (listen address)")
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

	cfg, err := worker.LoadConfig(*configPath)
	if err != nil {
		return err
	}
	overridden := false
	if *port >= 0 {
		cfg.Port, overridden = *port, true
	}
	if *instanceID != "" {
		cfg.InstanceID, overridden = *instanceID, true
	}
	if *hostname != "" {
		cfg.Hostname, overridden = *hostname, true
	}
	if *natsURL != "" {
		cfg.NATS.URLs = nil
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
	cfg.Logger = log
	cfg.Version = version

	srv, err := worker.New(cfg)
	if err != nil {
		return err
	}
	if err := srv.Start(ctx); err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return errors.Join(err, srv.Close(cctx))
	}
	fmt.Fprintf(os.Stderr, "tether worker %s listening on %s\n", cfg.InstanceID, srv.URL())
	<-ctx.Done()
	log.Info("shutting down", "grace", workerShutdownGrace)
	cctx, cancel := context.WithTimeout(context.Background(), workerShutdownGrace)
	defer cancel()
	return srv.Close(cctx)
}
