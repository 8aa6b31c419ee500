package main

import (
	"context"
	"errors"
	"fmt"
	"os"
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
	df := addDaemonFlags(fs, "nats.url")
	instanceID := fs.String("instance-id", "", "override instance_id")
	advertiseURL := fs.String("advertise-url", "", "override advertise_url (e.g. https://$(POD_NAME).<service>.<namespace>.svc.cluster.local:9000 for a StatefulSet pod)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := df.logger()
	if err != nil {
		return err
	}
	cfg, err := worker.LoadConfig(*df.config)
	if err != nil {
		return err
	}
	if applyOverrides([]override{
		{*df.port >= 0, func() { cfg.Port = *df.port }},
		{*instanceID != "", func() { cfg.InstanceID = *instanceID }},
		{*df.hostname != "", func() { cfg.Hostname = *df.hostname }},
		{*advertiseURL != "", func() { cfg.AdvertiseURL = *advertiseURL }},
		{*df.nats != "", func() { cfg.NATS.URLs = df.natsURLs() }},
	}) {
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("config %s with flags: %w", *df.config, err)
		}
	}
	cfg.Logger = log
	cfg.Version = version

	srv, err := worker.New(cfg)
	if err != nil {
		return err
	}
	if err := srv.Start(ctx); err != nil {
		return errors.Join(err, closeWithin(5*time.Second, srv.Close))
	}
	fmt.Fprintf(os.Stderr, "tether worker %s listening on %s\n", cfg.InstanceID, srv.URL())
	<-ctx.Done()
	log.Info("shutting down", "grace", workerShutdownGrace)
	return closeWithin(workerShutdownGrace, srv.Close)
}
