package devstack

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// levelCounter counts records at or above Warn that mention leadership,
// and every record at Error, keeping a few for the failure message.
type levelCounter struct {
	mu       sync.Mutex
	errors   int
	transfer int
	samples  []string
}

type levelHandler struct{ c *levelCounter }

func (h levelHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h levelHandler) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool {
		msg += " " + a.String()
		return true
	})
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	hit := false
	if r.Level >= slog.LevelError {
		h.c.errors++
		hit = true
	}
	if r.Level >= slog.LevelWarn && strings.Contains(strings.ToLower(msg), "leadership transfer") {
		h.c.transfer++
		hit = true
	}
	if hit && len(h.c.samples) < 5 {
		h.c.samples = append(h.c.samples, r.Level.String()+" "+msg)
	}
	return nil
}
func (h levelHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h levelHandler) WithGroup(string) slog.Handler      { return h }

func (c *levelCounter) counts() (errs, transfer int, samples []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errors, c.transfer, append([]string(nil), c.samples...)
}

// TestCloseStopsEveryEdgeWithoutHandingLeadershipOn closes a 3-edge stack
// several times and counts what the stop logs. When the whole deployment
// stops, no edge hands leadership to another that is stopping as well, and
// raft's reports of peers closing their connections are not errors: before,
// the edges closed leader first, each handing leadership to the next one to
// stop, and every stop printed raft ERROR lines (2 per stop here; 2 to 27
// in a tether dev stop).
func TestCloseStopsEveryEdgeWithoutHandingLeadershipOn(t *testing.T) {
	for round := range 3 {
		c := &levelCounter{}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		st, err := Start(ctx, Options{Logger: slog.New(levelHandler{c: c})})
		if err != nil {
			cancel()
			t.Fatalf("start: %v", err)
		}
		if err := st.WaitReady(ctx); err != nil {
			_ = st.Close(ctx)
			cancel()
			t.Fatal(err)
		}
		errsBefore, transferBefore, _ := c.counts()
		if err := st.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
		cancel()
		errs, transfer, samples := c.counts()
		if errs-errsBefore > 0 || transfer-transferBefore > 0 {
			t.Fatalf("round %d: the stop logged %d errors and %d leadership-transfer warnings, e.g. %q",
				round, errs-errsBefore, transfer-transferBefore, samples)
		}
	}
}
