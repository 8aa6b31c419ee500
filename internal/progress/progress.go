// Package progress reports a long operation's progress on a writer (tether
// audit's replays and exports, tether bench's runs): a redrawn bar when the
// writer is a terminal, plain lines every few seconds otherwise (a log file
// or CI output gets a line every interval, not a stream of carriage
// returns). An operation that finishes before the first line is due prints
// nothing.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Bar is one operation's progress on a writer; safe for concurrent use.
type Bar struct {
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

// New returns a Bar writing to w under label.
func New(w io.Writer, label string) *Bar {
	return &Bar{w: w, label: label, tty: isTerminal(w), every: 2 * time.Second, now: time.Now}
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

// Start begins an operation of total units.
func (p *Bar) Start(total uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// The first line is due one interval after the start: an operation
	// that finishes sooner prints nothing.
	p.total, p.done, p.started, p.last, p.printed = total, 0, p.now(), p.now(), false
}

// Update records done units.
func (p *Bar) Update(done uint64) {
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

// Done ends the operation.
func (p *Bar) Done() {
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

// Count is Start, Update and Done for a caller that reports done of total
// as it goes: the operation starts with the first count (or a new total)
// and ends when done reaches total.
func (p *Bar) Count(done, total int64) {
	if done < 0 || total <= 0 {
		return
	}
	p.mu.Lock()
	restart := uint64(total) != p.total || p.started.IsZero()
	p.mu.Unlock()
	if restart {
		p.Start(uint64(total))
	}
	p.Update(uint64(done))
	if done >= total {
		p.Done()
	}
}

// Stage starts a new stage of a run made of several (tether bench's e2e
// comparison: a deployment per policy, then its replay): it ends a bar
// being drawn, prints what the run waits for now, and the next Count
// starts a new operation.
func (p *Bar) Stage(what string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.printed && p.drawn < p.total {
		fmt.Fprintln(p.w)
	}
	p.total, p.done, p.started, p.printed, p.drawn = 0, 0, time.Time{}, false, 0
	fmt.Fprintf(p.w, "%s: %s\n", p.label, what)
}

func (p *Bar) draw(final bool) {
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
