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

// Stage: after one run's last line, a stage says what the run waits for
// and the next run is reported afresh.
func TestStage(t *testing.T) {
	var buf bytes.Buffer
	clock := time.Unix(0, 0)
	p := plain(&buf, &clock)
	run := func() {
		for i := int64(1); i <= 4; i++ {
			clock = clock.Add(time.Second)
			p.Count(i*5, 20)
		}
	}
	run()
	p.Stage("starting a deployment for prefix")
	run()
	out := buf.String()
	if strings.Count(out, "replay: 20/20 (100%)") != 2 || !strings.Contains(out, "replay: starting a deployment for prefix\n") {
		t.Fatalf("progress output:\n%s", out)
	}
}
