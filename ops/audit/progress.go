package audit

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Progress receives a long operation's progress in abstract units (log
// indexes for a replay).
type Progress interface {
	Start(total uint64)
	Update(done uint64)
	Done()
}

// NewProgress returns a Progress writing to w: a redrawn bar when w is a
// terminal, plain periodic lines otherwise (a log file or CI output gets a
// line every interval, not a stream of carriage returns).
func NewProgress(w io.Writer, label string) Progress {
	return &textProgress{w: w, label: label, tty: isTerminal(w), every: 2 * time.Second, now: time.Now}
}

// isTerminal reports whether w is a character device (a TTY).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

type textProgress struct {
	w     io.Writer
	label string
	tty   bool
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	total   uint64
	done    uint64
	started time.Time
	last    time.Time
	printed bool
	drawn   uint64 // the value last drawn
}

func (p *textProgress) Start(total uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// The first line is due one interval after the start: a replay that
	// finishes sooner prints nothing.
	p.total, p.started, p.last, p.printed = total, p.now(), p.now(), false
}

func (p *textProgress) Update(done uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = done
	now := p.now()
	interval := p.every
	if p.tty {
		interval = 100 * time.Millisecond
	}
	if now.Sub(p.last) < interval {
		return
	}
	p.last, p.printed = now, true
	p.draw(false)
}

func (p *textProgress) Done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.printed {
		return // finished before the first line was due: stay quiet
	}
	p.done = max(p.done, p.total)
	if p.drawn == p.done && !p.tty {
		return // the last line already says it
	}
	p.draw(true)
}

func (p *textProgress) draw(final bool) {
	p.drawn = p.done
	frac := 1.0
	if p.total > 0 {
		frac = min(float64(p.done)/float64(p.total), 1)
	}
	elapsed := p.now().Sub(p.started).Round(100 * time.Millisecond)
	if !p.tty {
		fmt.Fprintf(p.w, "%s: %d/%d (%.0f%%) after %s\n", p.label, p.done, p.total, 100*frac, elapsed)
		return
	}
	const width = 30
	filled := int(frac * width)
	bar := strings.Repeat("=", filled) + strings.Repeat(" ", width-filled)
	end := ""
	if final {
		end = "\n"
	}
	fmt.Fprintf(p.w, "\r%s [%s] %3.0f%% %d/%d %s%s", p.label, bar, 100*frac, p.done, p.total, elapsed, end)
}
