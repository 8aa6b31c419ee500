package faultnet

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tether-project/tether/test/waitfor"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoNode listens as node "b" and echoes every line back.
func echoNode(t *testing.T, n *Network, id string) string {
	t.Helper()
	ln, err := n.Listen(id)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var accepted []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted = append(accepted, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range accepted {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func roundTrip(c net.Conn, r *bufio.Reader, msg string, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return line[:len(line)-1], nil
}

func TestHealthyNetworkPassesBytes(t *testing.T) {
	n := New(1)
	addr := echoNode(t, n, "b")
	c, err := n.Dialer("a")(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := roundTrip(c, bufio.NewReader(c), "hello", 5*time.Second)
	if err != nil || got != "hello" {
		t.Fatalf("round trip = %q, %v", got, err)
	}
	if s := n.Stats(); s.Dials != 1 || s.BytesDropped != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestCutBlackholesAndHealClosesPoisonedConn(t *testing.T) {
	n := New(1)
	addr := echoNode(t, n, "b")
	c, err := n.Dialer("a")(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	n.Cut("a", "b")
	// The write "succeeds" (black hole) and no answer arrives: the
	// caller's deadline is what ends the wait, as on a real network.
	_, err = roundTrip(c, r, "lost", 200*time.Millisecond)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("round trip across a cut: err = %v, want a timeout", err)
	}
	if s := n.Stats(); s.BytesDropped == 0 {
		t.Fatalf("no bytes counted as dropped: %+v", s)
	}
	n.Heal()
	// The connection lost bytes: it is closed at heal, never spliced.
	if _, err := roundTrip(c, r, "after", 5*time.Second); err == nil {
		t.Fatal("poisoned connection still carried data after heal")
	}
	if s := n.Stats(); s.Poisoned != 1 {
		t.Fatalf("Poisoned = %d, want 1", s.Poisoned)
	}
	// A new connection works.
	c2, err := n.Dialer("a")(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got, err := roundTrip(c2, bufio.NewReader(c2), "again", 5*time.Second); err != nil || got != "again" {
		t.Fatalf("after heal: %q, %v", got, err)
	}
}

func TestOneWayCutDropsOnlyTheReturnPath(t *testing.T) {
	n := New(1)
	addr := echoNode(t, n, "b")
	c, err := n.Dialer("a")(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	// b → a cut: a's request reaches b (b echoes it) but the echo is lost.
	n.Cut("b", "a")
	if _, err := roundTrip(c, r, "ping", 200*time.Millisecond); err == nil {
		t.Fatal("echo crossed a cut return path")
	}
	waitFor(t, 5*time.Second, "the echo to be read and dropped", func() bool { return n.Stats().BytesDropped >= 5 })
	if got := n.Cuts(); len(got) != 1 || got[0] != (Link{"b", "a"}) {
		t.Fatalf("Cuts = %v", got)
	}
}

func TestDialAcrossCutWaitsForHealOrDeadline(t *testing.T) {
	n := New(1)
	addr := echoNode(t, n, "b")
	n.Partition("a", "b")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err := n.Dialer("a")(ctx, addr)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial across a partition: %v, want deadline exceeded", err)
	}
	done := make(chan error, 1)
	var c net.Conn
	go func() {
		var err error
		c, err = n.Dialer("a")(context.Background(), addr)
		done <- err
	}()
	waitFor(t, 5*time.Second, "the second dial to block", func() bool { return n.Stats().DialsBlocked == 2 })
	select {
	case err := <-done:
		t.Fatalf("dial returned before heal: %v", err)
	default:
	}
	n.Heal()
	if err := <-done; err != nil {
		t.Fatalf("dial after heal: %v", err)
	}
	defer c.Close()
	if s := n.Stats(); s.DialsFailed != 1 {
		t.Fatalf("DialsFailed = %d, want 1", s.DialsFailed)
	}
}

func TestIsolateCutsEveryPeer(t *testing.T) {
	n := New(1)
	for _, id := range []string{"a", "b", "c"} {
		echoNode(t, n, id)
	}
	n.Isolate("b")
	want := map[Link]bool{{"a", "b"}: true, {"b", "a"}: true, {"b", "c"}: true, {"c", "b"}: true}
	got := n.Cuts()
	if len(got) != len(want) {
		t.Fatalf("Cuts = %v, want %v", got, want)
	}
	for _, l := range got {
		if !want[l] {
			t.Fatalf("unexpected cut %v", l)
		}
	}
	n.HealLink("a", "b")
	if len(n.Cuts()) != 3 {
		t.Fatalf("HealLink healed more than one direction: %v", n.Cuts())
	}
	if got := n.Nodes(); len(got) != 3 || got[0] != "a" || got[2] != "c" {
		t.Fatalf("Nodes = %v", got)
	}
}

func TestDelayIsApplied(t *testing.T) {
	n := New(1)
	addr := echoNode(t, n, "b")
	n.Register("a", "127.0.0.1:1") // the dialing node; SetDelayAll covers registered pairs
	n.SetDelayAll(20*time.Millisecond, 5*time.Millisecond)
	c, err := n.Dialer("a")(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if got, err := roundTrip(c, bufio.NewReader(c), "slow", 5*time.Second); err != nil || got != "slow" {
		t.Fatalf("round trip = %q, %v", got, err)
	}
	// A lower bound is a property of the fault, not a timing target: the
	// write cannot leave before its delay.
	if el := time.Since(start); el < 20*time.Millisecond {
		t.Fatalf("round trip took %s, below the 20ms injected delay", el)
	}
	if n.Stats().WritesDelayed != 1 {
		t.Fatalf("WritesDelayed = %d", n.Stats().WritesDelayed)
	}
}

func TestResetIsSeededAndReplays(t *testing.T) {
	pattern := func(seed int64) []bool {
		n := New(seed)
		addr := echoNode(t, n, "b")
		n.SetResetRate("a", "b", 0.5)
		var out []bool
		for range 16 {
			c, err := n.Dialer("a")(context.Background(), addr)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Write([]byte("x\n"))
			out = append(out, errors.Is(err, ErrReset))
			c.Close()
		}
		return out
	}
	a, b := pattern(42), pattern(42)
	resets := 0
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seed 42 gave different reset patterns: %v vs %v", a, b)
		}
		if a[i] {
			resets++
		}
	}
	if resets == 0 || resets == len(a) {
		t.Fatalf("reset rate 0.5 gave %d/%d resets", resets, len(a))
	}
}

func TestUnregisteredAddressPassesThrough(t *testing.T) {
	n := New(1)
	other := New(2)
	addr := echoNode(t, other, "x") // registered in another network only
	n.Register("b", "127.0.0.1:1")
	n.Isolate("a")
	if len(n.Cuts()) != 2 {
		t.Fatalf("Cuts = %v", n.Cuts())
	}
	c, err := n.Dialer("a")(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, bufio.NewReader(c), "plain", 5*time.Second); err != nil || got != "plain" {
		t.Fatalf("round trip = %q, %v", got, err)
	}
}

var waitFor = waitfor.True
