package cluster

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// newRaftLogger routes hashicorp/raft's hclog output into the node's slog
// logger. Raft narrates every election and replication hiccup at INFO, so
// its INFO lines are only passed on when the slog logger shows DEBUG.
//
// While the node stops (stopping reports true), raft's errors are about the
// connections and transport being closed under it; they are logged at INFO.
func newRaftLogger(logger *slog.Logger, nodeID string, stopping func() bool) hclog.Logger {
	level := hclog.Warn
	if logger.Enabled(context.Background(), slog.LevelDebug) {
		level = hclog.Info
	}
	if !logger.Enabled(context.Background(), slog.LevelWarn) {
		return hclog.NewNullLogger()
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:            "raft",
		Level:           level,
		Output:          &slogLineWriter{log: logger.With("component", "raft", "node", nodeID), stopping: stopping},
		DisableTime:     true,
		IncludeLocation: false,
	})
}

// slogLineWriter turns hclog's text lines ("[WARN]  raft: msg: k=v") into
// slog records at the matching level.
type slogLineWriter struct {
	log      *slog.Logger
	stopping func() bool // nil: never
}

var _ io.Writer = (*slogLineWriter)(nil)

func (w *slogLineWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		s := strings.TrimSpace(string(line))
		if s == "" {
			continue
		}
		lvl := slog.LevelInfo
		switch {
		case strings.HasPrefix(s, "[ERROR]"):
			lvl, s = slog.LevelError, strings.TrimPrefix(s, "[ERROR]")
		case strings.HasPrefix(s, "[WARN]"):
			lvl, s = slog.LevelWarn, strings.TrimPrefix(s, "[WARN]")
			if firstElection(s) {
				lvl = slog.LevelInfo
			}
		case strings.HasPrefix(s, "[INFO]"):
			s = strings.TrimPrefix(s, "[INFO]")
		case strings.HasPrefix(s, "[DEBUG]"):
			lvl, s = slog.LevelDebug, strings.TrimPrefix(s, "[DEBUG]")
		case strings.HasPrefix(s, "[TRACE]"):
			lvl, s = slog.LevelDebug, strings.TrimPrefix(s, "[TRACE]")
		}
		if lvl == slog.LevelError && w.stopping != nil && w.stopping() {
			lvl = slog.LevelInfo
		}
		w.log.Log(context.Background(), lvl, strings.TrimSpace(s))
	}
	return len(p), nil
}

// firstElection reports raft's "heartbeat timeout reached, starting
// election" warning when no leader was ever known (empty last-leader-id):
// the election every new or restarted node holds at startup, not a fault.
func firstElection(s string) bool {
	return strings.Contains(s, "heartbeat timeout reached, starting election") &&
		(strings.Contains(s, "last-leader-id= ") || strings.HasSuffix(s, "last-leader-id="))
}
