package cluster

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// The first election of a starting node is not a warning (tether dev printed
// it at every start); an election after losing a known leader still is.
func TestFirstElectionIsNotAWarning(t *testing.T) {
	var buf bytes.Buffer
	w := &slogLineWriter{log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	_, _ = w.Write([]byte("[WARN]  raft: heartbeat timeout reached, starting election: last-leader-addr= last-leader-id=\n"))
	if buf.Len() != 0 {
		t.Fatalf("first election logged at warn: %s", buf.String())
	}
	_, _ = w.Write([]byte("[WARN]  raft: heartbeat timeout reached, starting election: last-leader-addr=127.0.0.1:5 last-leader-id=edge-2\n"))
	if !strings.Contains(buf.String(), "level=WARN") || !strings.Contains(buf.String(), "edge-2") {
		t.Fatalf("lost leader not warned: %q", buf.String())
	}
}
