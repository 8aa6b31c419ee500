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
	register("operator", "cluster administration through the edges' admin API: raft peers, leadership, instance drains, snapshots", runOperator)
}

const operatorUsage = `usage: tether operator <group> <command> [args] --edge URL[,URL...] [--admin-token T | $TETHER_ADMIN_TOKEN]

  raft list-peers                 the Raft configuration, the leader and each member's health
  raft remove-peer ID             remove a voter (returns once the change committed)
  raft transfer-leader [ID]       hand leadership to ID (or any voter)
  raft add-voter ID ADDR          add a voter at its Raft address host:port
  instance list                   the worker instances: log status, health, draining, drained, bindings, load
  instance drain NAME             no new conversations on NAME; each bound one moves on its next turn (scale-down)
  instance undrain NAME           end NAME's drain: it takes new conversations again
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
		"instance list": {0, 0}, "instance drain": {1, 1}, "instance undrain": {1, 1},
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
	case "instance list":
		il, err := c.Instances(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSONTo(out, il)
		}
		return printInstances(out, il)
	case "instance drain", "instance undrain":
		res, err := c.DrainInstance(ctx, pos[0], cmd == "drain")
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSONTo(out, res)
		}
		return printDrain(out, res)
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

func printInstances(w io.Writer, il operator.InstanceList) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%-24s %-10s %-10s %-8s %-9s %-8s %-9s %-7s %s\n", "ID", "FLEET", "LOG", "HEALTHY", "DRAINING", "DRAINED", "BINDINGS", "QUEUED", "URL")
	for _, in := range il.Instances {
		logStatus := in.LogStatus
		if logStatus == "" {
			logStatus = "-"
		}
		drained := fmt.Sprint(in.Drained)
		if in.DrainedSince != nil {
			drained += " (since " + in.DrainedSince.Format(time.RFC3339) + ")"
		}
		fmt.Fprintf(&b, "%-24s %-10s %-10s %-8v %-9v %-8s %-9d %-7d %s\n", in.ID, in.Fleet, logStatus, in.Healthy, in.Draining, drained, in.Bindings, in.QueuedRequests, in.URL)
	}
	if len(il.Instances) == 0 {
		fmt.Fprintf(&b, "(no instances known to %s)\n", il.Edge)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func printDrain(w io.Writer, res operator.DrainResult) error {
	var msg string
	switch {
	case res.Drained && res.Changed:
		msg = fmt.Sprintf("drained %s (%s) via %s: no new conversations; its %d bound ones move on their next turns (log status %s, state index %d)\n",
			res.Instance, res.Fleet, res.Edge, res.Bindings, res.LogStatus, res.StateIndex)
	case res.Drained:
		msg = fmt.Sprintf("%s (%s) was already drained (since %s); %d bindings left (state index %d)\n",
			res.Instance, res.Fleet, res.DrainedSince.Format(time.RFC3339), res.Bindings, res.StateIndex)
	case res.Changed:
		msg = fmt.Sprintf("undrained %s (%s) via %s: it takes new conversations again (log status %s, state index %d)\n",
			res.Instance, res.Fleet, res.Edge, res.LogStatus, res.StateIndex)
	default:
		msg = fmt.Sprintf("%s (%s) was not drained (state index %d)\n", res.Instance, res.Fleet, res.StateIndex)
	}
	_, err := io.WriteString(w, msg)
	return err
}

func orNone(s string) string {
	if s == "" {
		return "(none known yet)"
	}
	return s
}
