package progress

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func plain(buf *bytes.Buffer, clock *time.Time) *Bar {
	return &Bar{w: buf, label: "replay", every: 2 * time.Second, now: func() time.Time { return *clock }}
}

func TestPlainLines(t *testing.T) {
	var buf bytes.Buffer
	clock := time.Unix(0, 0)
	p := plain(&buf, &clock)
	p.Start(1000)
	for i := uint64(1); i <= 10; i++ {
		clock = clock.Add(time.Second)
		p.Update(i * 100)
	}
	p.Done()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "replay: 200/1000 (20%)") || !strings.HasPrefix(lines[4], "replay: 1000/1000 (100%)") {
		t.Fatalf("plain progress lines:\n%s", buf.String())
	}
	if strings.Contains(buf.String(), "\r") {
		t.Fatal("plain progress must not redraw with carriage returns")
	}
	// A run shorter than the interval prints nothing.
	buf.Reset()
	p.Start(10)
	p.Update(10)
	p.Done()
	if buf.Len() != 0 {
		t.Fatalf("a short run printed %q", buf.String())
	}
}

// Count: a caller that only says done of total gets the same lines, the
// last one when done reaches total.
func TestCount(t *testing.T) {
	var buf bytes.Buffer
	clock := time.Unix(0, 0)
	p := plain(&buf, &clock)
	for i := int64(1); i <= 10; i++ {
		clock = clock.Add(time.Second)
		p.Count(i*100, 1000)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[4], "replay: 1000/1000 (100%)") {
		t.Fatalf("counted progress lines:\n%s", buf.String())
	}
}
