package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"
)

// daemonFlags are the flags `tether edge` and `tether worker` share: the
// config file and the overrides a launcher sets per process.
type daemonFlags struct {
	config, hostname, nats, logLevel *string
	port                             *int
}

func addDaemonFlags(fs *flag.FlagSet, natsKey string) daemonFlags {
	return daemonFlags{
		config:   fs.String("config", "", "path to the YAML configuration (required)"),
		port:     fs.Int("port", -1, "override port (0 picks a free port)"),
		hostname: fs.String("hostname", "", "override hostname (listen address)"),
		nats:     fs.String("nats", "", "override "+natsKey+" (comma-separated URLs)"),
		logLevel: fs.String("log-level", "info", "log level: debug, info, warn or error"),
	}
}

// logger checks the required --config and builds the stderr logger at
// --log-level.
func (d daemonFlags) logger() (*slog.Logger, error) {
	if *d.config == "" {
		return nil, fmt.Errorf("%w: --config is required", errUsage)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*d.logLevel)); err != nil {
		return nil, fmt.Errorf("%w: --log-level: %v", errUsage, err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})), nil
}

// natsURLs is --nats split into URLs (nil when the flag is not set).
func (d daemonFlags) natsURLs() []string {
	var urls []string
	for _, u := range strings.Split(*d.nats, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	return urls
}

// override is one flag that replaces a config value when it is set.
type override struct {
	set bool
	do  func()
}

// applyOverrides applies the set overrides and reports whether any was: the
// config is then validated again.
func applyOverrides(list []override) bool {
	changed := false
	for _, o := range list {
		if o.set {
			o.do()
			changed = true
		}
	}
	return changed
}

// closeWithin runs close with a fresh deadline of grace: the context that
// ended the run is already done.
func closeWithin(grace time.Duration, close func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	return close(ctx)
}
