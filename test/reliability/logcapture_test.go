package reliability

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// logLines keeps what a component logged (message and attributes as one
// line each, bounded), so a negative test can assert the reason a refusal
// was logged with when the refused party cannot see it (a peer that closes
// the connection tells the client nothing).
type logLines struct {
	mu    sync.Mutex
	lines []string
	next  slog.Handler // also logs here (RELIABILITY_LOG), may be nil
	attrs string
}

const maxLogLines = 20000

func newLogLines() *logLines {
	l := &logLines{}
	if h := logger().Handler(); h.Enabled(context.Background(), slog.LevelDebug) {
		l.next = h
	}
	return l
}

// logger returns a logger that records into l.
func (l *logLines) logger() *slog.Logger { return slog.New(&captureHandler{l: l}) }

// find returns the first line containing every one of parts ("" if none).
func (l *logLines) find(parts ...string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		ok := true
		for _, p := range parts {
			if !strings.Contains(line, p) {
				ok = false
				break
			}
		}
		if ok {
			return line
		}
	}
	return ""
}

type captureHandler struct {
	l     *logLines
	attrs string
	next  slog.Handler
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *captureHandler) Handle(ctx context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message + h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	h.l.mu.Lock()
	if len(h.l.lines) < maxLogLines {
		h.l.lines = append(h.l.lines, b.String())
	}
	h.l.mu.Unlock()
	if h.next != nil {
		return h.next.Handle(ctx, r)
	}
	if h.l.next != nil {
		return h.l.next.Handle(ctx, r)
	}
	return nil
}

func (h *captureHandler) WithAttrs(as []slog.Attr) slog.Handler {
	var b strings.Builder
	b.WriteString(h.attrs)
	for _, a := range as {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	n := &captureHandler{l: h.l, attrs: b.String()}
	if h.l.next != nil {
		n.next = h.l.next.WithAttrs(as)
	}
	return n
}

func (h *captureHandler) WithGroup(string) slog.Handler { return h }
