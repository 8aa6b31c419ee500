package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Progress reports a long run's completion on a writer: a redrawn bar when
// the writer is a terminal, plain lines every ten percent (and at most every
// few seconds) otherwise.
type Progress struct {
	mu       sync.Mutex
	w        io.Writer
	label    string
	tty      bool
	started  time.Time
	lastPct  int
	lastLine time.Time
	finished bool
}

// NewProgress returns a progress reporter for w; a nil w reports nothing.
func NewProgress(w io.Writer, label string) *Progress {
	p := &Progress{w: w, label: label, started: time.Now(), lastPct: -1}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// Update records done of total units.
func (p *Progress) Update(done, total int64) {
	if p == nil || p.w == nil || total <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished {
		return
	}
	pct := int(done * 100 / total)
	elapsed := time.Since(p.started).Round(100 * time.Millisecond)
	if p.tty {
		if pct == p.lastPct && done != total {
			return
		}
		p.lastPct = pct
		const width = 30
		fill := int(done * width / total)
		fmt.Fprintf(p.w, "\r%s [%s%s] %3d%% %d/%d %v", p.label, strings.Repeat("=", fill), strings.Repeat(" ", width-fill), pct, done, total, elapsed)
		if done == total {
			fmt.Fprintln(p.w)
			p.finished = true
		}
		return
	}
	if done != total && (pct/10 == p.lastPct/10 || time.Since(p.lastLine) < 2*time.Second) {
		return
	}
	p.lastPct, p.lastLine = pct, time.Now()
	fmt.Fprintf(p.w, "%s: %d%% (%d/%d requests, %v)\n", p.label, pct, done, total, elapsed)
	if done == total {
		p.finished = true
	}
}

// Stage starts a new stage: it prints what the run now waits for and
// reports the next run's progress afresh (a finished bar stays silent
// otherwise).
func (p *Progress) Stage(what string) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && !p.finished && p.lastPct >= 0 {
		fmt.Fprintln(p.w)
	}
	p.finished, p.lastPct, p.started = false, -1, time.Now()
	fmt.Fprintf(p.w, "%s: %s\n", p.label, what)
}
