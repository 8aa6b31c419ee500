package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/tether-project/tether/ops/operator"
)

func init() {
	register("operator", "cluster administration through the edges' admin API: raft peers, leadership, snapshots", runOperator)
}

const operatorUsage = `usage: tether operator <group> <command> [args] --edge URL[,URL...] [--admin-token T | $TETHER_ADMIN_TOKEN]

  raft list-peers                 the Raft configuration, the leader and each member's health
  raft remove-peer ID             remove a voter (returns once the change committed)
  raft transfer-leader [ID]       hand leadership to ID (or any voter)
  raft add-voter ID ADDR          add a voter at its Raft address host:port
  snapshot save FILE              download the current state (FILE and FILE.json with index, term, hash)
  snapshot restore FILE           replace the cluster's state (runs on the leader: list several edges)
  snapshot inspect FILE           offline: index, term, hash, counts per event type and fleet

flags: --edge (repeatable or comma-separated), --admin-token, --timeout, --json,
       --cacert CA.pem (edges serving HTTPS), --cert/--key (edges requiring client certificates)
`

// stringList is a repeatable, comma-separated flag.
type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }

func (s *stringList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*s = append(*s, p)
		}
	}
	return nil
}

func runOperator(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, operatorUsage)
		return fmt.Errorf("%w: a command is required", errUsage)
	}
	if helpArg(args[0]) {
		fmt.Fprint(os.Stdout, operatorUsage)
		return nil
	}
	if len(args) < 2 {
		fmt.Fprint(os.Stderr, operatorUsage)
		return fmt.Errorf("%w: %q needs a command", errUsage, args[0])
	}
	if helpArg(args[1]) {
		// `tether operator raft --help`: help, not a usage error.
		fmt.Fprint(os.Stdout, operatorUsage)
		return nil
	}
	group, cmd := args[0], args[1]
	name := group + " " + cmd
	fs := newFlagSet("operator " + name)
	fs.Usage = func() { fmt.Fprint(fs.Output(), operatorUsage) }
	var edges stringList
	fs.Var(&edges, "edge", "an edge's base URL, e.g. http://10.0.0.1:8000 (repeatable, or comma-separated)")
	token := fs.String("admin-token", "", "admin API bearer token (default $"+operator.EnvAdminToken+")")
	timeout := fs.Duration("timeout", 0, "give up after this long (default 30s; 10m for snapshots)")
	asJSON := fs.Bool("json", false, "print JSON")
	tlsFlags := addAdminTLSFlags(fs)
	pos, err := parseInterspersed(fs, args[2:])
	if err != nil {
		return err
	}
	want := map[string][2]int{ // min, max positional arguments
		"raft list-peers": {0, 0}, "raft remove-peer": {1, 1}, "raft transfer-leader": {0, 1}, "raft add-voter": {2, 2},
		"snapshot save": {1, 1}, "snapshot restore": {1, 1}, "snapshot inspect": {1, 1},
	}
	n, ok := want[name]
	if !ok {
		fmt.Fprint(os.Stderr, operatorUsage)
		return fmt.Errorf("%w: unknown operator command %q", errUsage, name)
	}
	if len(pos) < n[0] || len(pos) > n[1] {
		return fmt.Errorf("%w: operator %s takes %d..%d arguments, got %d (%s)", errUsage, name, n[0], n[1], len(pos), strings.Join(pos, " "))
	}
	out := os.Stdout
	if name == "snapshot inspect" { // offline: no edge needed
		rep, err := operator.InspectSnapshot(pos[0])
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSONTo(out, rep)
		}
		return rep.WriteText(out)
	}
	tok := *token
	if tok == "" {
		tok = os.Getenv(operator.EnvAdminToken)
	}
	hc, err := tlsFlags.client()
	if err != nil {
		return err
	}
	c, err := operator.New(edges, tok, hc)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	defer c.Close()
	d := *timeout
	if d <= 0 {
		d = 30 * time.Second
		if group == "snapshot" {
			d = 10 * time.Minute
		}
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	switch name {
	case "raft list-peers":
		pl, err := c.ListPeers(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSONTo(out, pl)
		}
		fmt.Fprintf(out, "%-20s %-28s %-8s %-8s %-8s %-12s %-8s %-6s %s\n", "ID", "ADDRESS", "VOTER", "LEADER", "HEALTHY", "LAST_CONTACT", "LAG", "TERM", "SUFFRAGE")
		for _, p := range pl.Peers {
			lead := ""
			if p.ID == pl.Leader {
				lead = "leader"
			}
			suffrage := "voter"
			if !p.Voter {
				suffrage = "nonvoter"
			}
			healthy, contact, lag, term := "?", "?", "?", "?"
			if h := p.Health; h != nil {
				healthy, lag, term = fmt.Sprint(h.Healthy), fmt.Sprint(h.Lag), fmt.Sprint(h.LastTerm)
				if h.Suffrage != "" {
					suffrage = h.Suffrage
				}
				contact = "never"
				if h.LastContactMS >= 0 {
					contact = fmt.Sprintf("%.0fms", h.LastContactMS)
				}
				if h.Status != "alive" {
					healthy = h.Status
				}
			}
			fmt.Fprintf(out, "%-20s %-28s %-8v %-8s %-8s %-12s %-8s %-6s %s\n", p.ID, p.Addr, p.Voter, lead, healthy, contact, lag, term, suffrage)
		}
		if pl.Leader == "" {
			fmt.Fprintf(out, "(no leader known to %s)\n", pl.Edge)
		}
		return nil
	case "raft remove-peer", "raft add-voter", "raft transfer-leader":
		var res operator.MembershipResult
		switch cmd {
		case "remove-peer":
			res, err = c.RemovePeer(ctx, pos[0])
		case "add-voter":
			res, err = c.AddVoter(ctx, pos[0], pos[1])
		default:
			id := ""
			if len(pos) == 1 {
				id = pos[0]
			}
			res, err = c.TransferLeader(ctx, id)
		}
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSONTo(out, res)
		}
		return printMembership(out, res)
	case "snapshot save":
		info, err := c.SaveSnapshot(ctx, pos[0])
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSONTo(out, info)
		}
		fmt.Fprintf(out, "saved %s (%d bytes) from %s: index %d, term %d, %d bindings, state hash %s (metadata in %s)\n",
			pos[0], info.Size, info.Edge, info.Index, info.Term, info.Bindings, info.Hash, operator.SidecarPath(pos[0]))
		return nil
	case "snapshot restore":
		res, err := c.RestoreSnapshot(ctx, pos[0])
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSONTo(out, res)
		}
		fmt.Fprintf(out, "restored %s through %s: the cluster's state is at index %d, %d bindings, state hash %s\n",
			pos[0], res.Edge, res.Index, res.Bindings, res.Hash)
		return nil
	}
	return nil
}

func printMembership(w io.Writer, res operator.MembershipResult) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s committed (via %s); leader %s; configuration:\n", res.Op, res.Edge, orNone(res.Leader))
	for _, p := range res.Peers {
		fmt.Fprintf(&b, "  %-20s %-28s voter=%v\n", p.ID, p.Addr, p.Voter)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func orNone(s string) string {
	if s == "" {
		return "(none known yet)"
	}
	return s
}
