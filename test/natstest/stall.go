package natstest

import (
	"net"
	"sync"
	"testing"
)

// StallProxy relays TCP connections to a server until Stall: then every
// relayed connection stays open but nothing more passes either way, and
// new connections are accepted and never relayed — what a client sees when
// its peer is cut off by the network (no reset, no FIN; writes fill the
// socket's buffers, then block).
type StallProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	stalled bool
	resume  chan struct{} // closed by Resume
	conns   []net.Conn
}

// NewStallProxy relays 127.0.0.1:<port> to target until the test ends.
func NewStallProxy(t testing.TB, target string) *StallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &StallProxy{ln: ln, target: target, resume: make(chan struct{})}
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's address.
func (p *StallProxy) Addr() string { return p.ln.Addr().String() }

// Stall stops the relaying (connections stay open).
func (p *StallProxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stalled {
		p.stalled, p.resume = true, make(chan struct{})
	}
}

// Resume relays again (what waited goes through).
func (p *StallProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled {
		p.stalled = false
		close(p.resume)
	}
}

// gate returns once the proxy is not stalled.
func (p *StallProxy) gate() {
	p.mu.Lock()
	stalled, resume := p.stalled, p.resume
	p.mu.Unlock()
	if stalled {
		<-resume
	}
}

func (p *StallProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		p.mu.Unlock()
		go p.relay(c)
	}
}

func (p *StallProxy) relay(c net.Conn) {
	p.gate()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, s)
	p.mu.Unlock()
	go p.pipe(s, c)
	p.pipe(c, s)
}

// pipe copies from src to dst, holding each chunk while the proxy is
// stalled (it reads nothing more meanwhile, so the sender's writes back up).
func (p *StallProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		p.gate()
		n, err := src.Read(buf)
		if n > 0 {
			p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or the connection closed: close the other side
		}
	}
}

func (p *StallProxy) close() {
	p.ln.Close()
	p.Resume()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}
