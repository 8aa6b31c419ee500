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

// operatorCommand is one "group command" of tether operator: how many
// positional arguments it takes and how it runs. An offline command reads
// local files; every other one runs against the edges.
type operatorCommand struct {
	minArgs, maxArgs int
	offline          func(pos []string, out io.Writer, asJSON bool) error
	run              operatorRun
}

// operatorRun runs a command against the edges through c, with its
// positional arguments pos, writing its answer to out.
type operatorRun func(ctx context.Context, c *operator.Client, pos []string, out io.Writer, asJSON bool) error

// operatorCommands registers each operator command under "group command".
var operatorCommands = map[string]operatorCommand{
	"raft list-peers":      {0, 0, nil, operatorListPeers},
	"raft remove-peer":     {1, 1, nil, operatorRemovePeer},
	"raft transfer-leader": {0, 1, nil, operatorTransferLeader},
	"raft add-voter":       {2, 2, nil, operatorAddVoter},
	"snapshot save":        {1, 1, nil, operatorSaveSnapshot},
	"snapshot restore":     {1, 1, nil, operatorRestoreSnapshot},
	"snapshot inspect":     {1, 1, operatorInspectSnapshot, nil},
	"instance list":        {0, 0, nil, operatorListInstances},
	"instance drain":       {1, 1, nil, operatorDrain(true)},
	"instance undrain":     {1, 1, nil, operatorDrain(false)},
}

func runOperator(ctx context.Context, args []string) error {
	if done, err := groupUsage(args, operatorUsage, "a command is required"); done {
		return err
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
	command, ok := operatorCommands[name]
	if !ok {
		fmt.Fprint(os.Stderr, operatorUsage)
		return fmt.Errorf("%w: unknown operator command %q", errUsage, name)
	}
	if len(pos) < command.minArgs || len(pos) > command.maxArgs {
		return fmt.Errorf("%w: operator %s takes %d..%d arguments, got %d (%s)", errUsage, name, command.minArgs, command.maxArgs, len(pos), strings.Join(pos, " "))
	}
	out := os.Stdout
	if command.offline != nil { // no edge needed
		return command.offline(pos, out, *asJSON)
	}
	c, err := tlsFlags.adminClient(edges, *token)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, operatorTimeout(*timeout, group))
	defer cancel()
	return command.run(ctx, c, pos, out, *asJSON)
}

// operatorTimeout is --timeout, or when unset 30s (10m for the snapshot
// commands, which move the whole state).
func operatorTimeout(set time.Duration, group string) time.Duration {
	if set > 0 {
		return set
	}
	if group == "snapshot" {
		return 10 * time.Minute
	}
	return 30 * time.Second
}

// printResult writes v as JSON, or as text with text.
func printResult(out io.Writer, asJSON bool, v any, text func() error) error {
	if asJSON {
		return writeJSONTo(out, v)
	}
	return text()
}

// operatorInspectSnapshot is "snapshot inspect FILE", offline.
func operatorInspectSnapshot(pos []string, out io.Writer, asJSON bool) error {
	rep, err := operator.InspectSnapshot(pos[0])
	if err != nil {
		return err
	}
	return printResult(out, asJSON, rep, func() error { return rep.WriteText(out) })
}

// operatorListPeers is "raft list-peers": a table of the Raft configuration
// with each member's health.
func operatorListPeers(ctx context.Context, c *operator.Client, _ []string, out io.Writer, asJSON bool) error {
	pl, err := c.ListPeers(ctx)
	if err != nil {
		return err
	}
	return printResult(out, asJSON, pl, func() error { return printPeers(out, pl) })
}

// printPeers writes the peer table of "raft list-peers".
func printPeers(out io.Writer, pl operator.PeerList) error {
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
}

// operatorRemovePeer is "raft remove-peer ID".
func operatorRemovePeer(ctx context.Context, c *operator.Client, pos []string, out io.Writer, asJSON bool) error {
	res, err := c.RemovePeer(ctx, pos[0])
	return printMembershipResult(out, asJSON, res, err)
}

// operatorAddVoter is "raft add-voter ID ADDR".
func operatorAddVoter(ctx context.Context, c *operator.Client, pos []string, out io.Writer, asJSON bool) error {
	res, err := c.AddVoter(ctx, pos[0], pos[1])
	return printMembershipResult(out, asJSON, res, err)
}

// operatorTransferLeader is "raft transfer-leader [ID]": to ID, or to any
// voter.
func operatorTransferLeader(ctx context.Context, c *operator.Client, pos []string, out io.Writer, asJSON bool) error {
	id := ""
	if len(pos) == 1 {
		id = pos[0]
	}
	res, err := c.TransferLeader(ctx, id)
	return printMembershipResult(out, asJSON, res, err)
}

// printMembershipResult writes a committed membership change, or returns
// the error that kept it from committing.
func printMembershipResult(out io.Writer, asJSON bool, res operator.MembershipResult, err error) error {
	if err != nil {
		return err
	}
	return printResult(out, asJSON, res, func() error { return printMembership(out, res) })
}

// operatorListInstances is "instance list".
func operatorListInstances(ctx context.Context, c *operator.Client, _ []string, out io.Writer, asJSON bool) error {
	il, err := c.Instances(ctx)
	if err != nil {
		return err
	}
	return printResult(out, asJSON, il, func() error { return printInstances(out, il) })
}

// operatorDrain is "instance drain NAME" (drain true) or "instance undrain
// NAME" (drain false).
func operatorDrain(drain bool) operatorRun {
	return func(ctx context.Context, c *operator.Client, pos []string, out io.Writer, asJSON bool) error {
		res, err := c.DrainInstance(ctx, pos[0], drain)
		if err != nil {
			return err
		}
		return printResult(out, asJSON, res, func() error { return printDrain(out, res) })
	}
}

// operatorSaveSnapshot is "snapshot save FILE": the state and its metadata
// sidecar.
func operatorSaveSnapshot(ctx context.Context, c *operator.Client, pos []string, out io.Writer, asJSON bool) error {
	info, err := c.SaveSnapshot(ctx, pos[0])
	if err != nil {
		return err
	}
	return printResult(out, asJSON, info, func() error {
		fmt.Fprintf(out, "saved %s (%d bytes) from %s: index %d, term %d, %d bindings, state hash %s (metadata in %s)\n",
			pos[0], info.Size, info.Edge, info.Index, info.Term, info.Bindings, info.Hash, operator.SidecarPath(pos[0]))
		return nil
	})
}

// operatorRestoreSnapshot is "snapshot restore FILE", run on the leader.
func operatorRestoreSnapshot(ctx context.Context, c *operator.Client, pos []string, out io.Writer, asJSON bool) error {
	res, err := c.RestoreSnapshot(ctx, pos[0])
	if err != nil {
		return err
	}
	return printResult(out, asJSON, res, func() error {
		fmt.Fprintf(out, "restored %s through %s: the cluster's state is at index %d, %d bindings, state hash %s\n",
			pos[0], res.Edge, res.Index, res.Bindings, res.Hash)
		return nil
	})
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
