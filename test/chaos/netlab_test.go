package chaos

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// netlab is a network of Linux network namespaces for processes that must
// be partitioned from each other: a hub namespace holds one bridge per
// segment, every member namespace has a veth pair into each bridge it is
// on (named after the segment inside the member, "<member>-<segment>" in
// the hub) with an address of its own, and the test's namespace reaches
// the client segment through one veth of its own. A member's bridge port
// taken down (ip link set … down in the hub) cuts that member from that
// segment in both directions: frames to and from it are dropped, a connect
// times out, an established connection stalls until the port comes back.
// Everything is set up and torn down by the test; it needs root (and
// iproute2), and netlabAvailable says why it cannot run elsewhere.
type netlab struct {
	t        *testing.T
	tag      string // short and random: names and the client subnet are the run's own
	hub      string
	base     int // the second octet of every segment's 10.<base>.<segment>.0/24
	segments []string
	members  map[string]*netMember
	rootIf   string
	mu       sync.Mutex
	cut      map[string]bool // "<member>/<segment>" currently down
}

// netMember is one process's namespace and its address on each segment.
type netMember struct {
	name string
	ns   string
	addr map[string]string // segment → IPv4 address
}

// clientSegment is the segment the test itself is on (its load generator
// and admin calls): every member has an address there.
const clientSegment = "cli"

// netlabAvailable reports why network namespaces cannot be used here ("" when they can).
func netlabAvailable() string {
	if os.Geteuid() != 0 {
		return "network namespaces need root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "iproute2's ip is not installed"
	}
	probe := "tether-probe-" + randomTag()
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		return fmt.Sprintf("ip netns add fails here: %v: %s", err, strings.TrimSpace(string(out)))
	}
	_ = exec.Command("ip", "netns", "del", probe).Run()
	return ""
}

func randomTag() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newNetlab makes the hub and its segments' bridges (the client segment
// added to segs), and the test's own link to the client segment. Cleanup
// removes every namespace (and with them every veth) after the test's
// later cleanups stopped the processes.
func newNetlab(t *testing.T, segs ...string) *netlab {
	t.Helper()
	if why := netlabAvailable(); why != "" {
		t.Skipf("partitions between processes: %s (the in-process fault network of test/reliability covers partitions)", why)
	}
	n := &netlab{t: t, tag: randomTag(), members: map[string]*netMember{}, cut: map[string]bool{}}
	n.segments = append(append([]string(nil), segs...), clientSegment)
	n.hub = "tether-" + n.tag + "-hub"
	n.rootIf = "tt" + n.tag
	n.base = n.freeBase()
	t.Cleanup(n.close)
	n.ip("netns", "add", n.hub)
	n.ip("-n", n.hub, "link", "set", "lo", "up")
	for _, s := range n.segments {
		n.ip("-n", n.hub, "link", "add", "br-"+s, "type", "bridge")
		n.ip("-n", n.hub, "link", "set", "br-"+s, "up")
	}
	n.ip("link", "add", n.rootIf, "type", "veth", "peer", "name", "root-"+clientSegment, "netns", n.hub)
	n.ip("-n", n.hub, "link", "set", "root-"+clientSegment, "master", "br-"+clientSegment, "up")
	n.ip("addr", "add", fmt.Sprintf("%s/24", n.rootAddr()), "dev", n.rootIf)
	n.ip("link", "set", n.rootIf, "up")
	return n
}

// freeBase picks a second octet whose client subnet the test's namespace
// does not route already.
func (n *netlab) freeBase() int {
	out, err := exec.Command("ip", "-4", "route", "show").CombinedOutput()
	if err != nil {
		n.t.Fatalf("ip route: %v: %s", err, out)
	}
	for range 64 {
		b := make([]byte, 1)
		_, _ = rand.Read(b)
		base := 64 + int(b[0])%128
		if !strings.Contains(string(out), fmt.Sprintf("10.%d.", base)) {
			return base
		}
	}
	n.t.Fatal("no free 10.x.0.0/16 for the test network")
	return 0
}

// segmentIndex is s's third octet.
func (n *netlab) segmentIndex(s string) int {
	for i, x := range n.segments {
		if x == s {
			return i + 1
		}
	}
	n.t.Fatalf("netlab: no segment %q", s)
	return 0
}

// rootAddr is the test's own address on the client segment.
func (n *netlab) rootAddr() string {
	return fmt.Sprintf("10.%d.%d.1", n.base, n.segmentIndex(clientSegment))
}

// clientCIDR is the client segment's network.
func (n *netlab) clientCIDR() string {
	return fmt.Sprintf("10.%d.%d.0/24", n.base, n.segmentIndex(clientSegment))
}

// add makes member name's namespace with an address on each of segs and on
// the client segment.
func (n *netlab) add(name string, segs ...string) *netMember {
	n.t.Helper()
	m := &netMember{name: name, ns: "tether-" + n.tag + "-" + name, addr: map[string]string{}}
	host := len(n.members) + 2
	n.members[name] = m
	n.ip("netns", "add", m.ns)
	n.ip("-n", m.ns, "link", "set", "lo", "up")
	for _, s := range append(append([]string(nil), segs...), clientSegment) {
		port := n.port(name, s)
		n.ip("link", "add", s, "netns", m.ns, "type", "veth", "peer", "name", port, "netns", n.hub)
		n.ip("-n", n.hub, "link", "set", port, "master", "br-"+s, "up")
		m.addr[s] = fmt.Sprintf("10.%d.%d.%d", n.base, n.segmentIndex(s), host)
		n.ip("-n", m.ns, "addr", "add", m.addr[s]+"/24", "dev", s)
		n.ip("-n", m.ns, "link", "set", s, "up")
	}
	return m
}

// port is the hub-side name of member's link to segment s (at most 15
// bytes, as Linux allows).
func (n *netlab) port(member, s string) string {
	p := member + "-" + s
	if len(p) > 15 {
		n.t.Fatalf("netlab: interface name %q longer than 15 bytes", p)
	}
	return p
}

// exec is the command prefix that runs a process in m's namespace.
func (m *netMember) exec() []string { return []string{"ip", "netns", "exec", m.ns} }

// partition takes member's ports on segs (every segment but the client's
// when none is named) down.
func (n *netlab) partition(member string, segs ...string) {
	n.t.Helper()
	n.setPorts(member, "down", segs)
}

// heal brings member's ports on segs (every cut one when none is named)
// back up.
func (n *netlab) heal(member string, segs ...string) {
	n.t.Helper()
	n.setPorts(member, "up", segs)
}

func (n *netlab) setPorts(member, state string, segs []string) {
	n.t.Helper()
	m, ok := n.members[member]
	if !ok {
		n.t.Fatalf("netlab: no member %q", member)
	}
	if len(segs) == 0 {
		for s := range m.addr {
			if s != clientSegment {
				segs = append(segs, s)
			}
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range segs {
		if _, ok := m.addr[s]; !ok {
			continue
		}
		n.ip("-n", n.hub, "link", "set", n.port(member, s), state)
		n.cut[member+"/"+s] = state == "down"
	}
}

// ip runs one iproute2 command and fails the test when it fails.
func (n *netlab) ip(args ...string) {
	n.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		n.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// close deletes every namespace the lab made (their veths go with them;
// the test's own veth goes with the hub).
func (n *netlab) close() {
	var failed []string
	for _, m := range n.members {
		if out, err := exec.Command("ip", "netns", "del", m.ns).CombinedOutput(); err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v: %s", m.ns, err, out))
		}
	}
	if out, err := exec.Command("ip", "netns", "del", n.hub).CombinedOutput(); err != nil {
		failed = append(failed, fmt.Sprintf("%s: %v: %s", n.hub, err, out))
	}
	// The test's veth disappears with its peer in the hub; wait until it has.
	deadline := time.Now().Add(10 * time.Second)
	for exec.Command("ip", "link", "show", n.rootIf).Run() == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if len(failed) > 0 {
		n.t.Errorf("netlab teardown: %s", strings.Join(failed, "; "))
	}
}
