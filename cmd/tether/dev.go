package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/ops/devstack"
	"github.com/tether-project/tether/routing"
	"github.com/tether-project/tether/worker"
)

func init() {
	register("dev", "run a whole local deployment in one process: edges (Raft), NATS, simulated workers", runDev)
}

// devShutdownGrace bounds the shutdown after SIGINT/SIGTERM: workers drain,
// edges hand over leadership, NATS stops.
const devShutdownGrace = 30 * time.Second

// runDev is `tether dev`. Its standard output is meant for people and for
// tests: one "name: value" line per endpoint (edge-N, ctx-N, gen-N, nats,
// data dir, ca cert, admin token), an example, then a line containing
// "ready" once the stack is ready. Logs go to standard error.
func runDev(ctx context.Context, args []string) error {
	fs := newFlagSet("dev")
	f := newDevFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	opts, err := f.options()
	if err != nil {
		return err
	}
	out := os.Stdout
	security := "mutual TLS (ephemeral CA)"
	if *f.plaintext {
		security = "PLAINTEXT"
		opts.Logger.Warn("tether dev --plaintext: Raft, the HTTP and admin API, worker hops and NATS are unencrypted and unauthenticated by certificate")
	}
	fmt.Fprintf(out, "tether dev: starting %s, %s, scope %s, engine time scale %g, %s\n",
		plural(opts.Edges, "edge"), topology(opts), opts.Scope, opts.TimeScale, security)

	st, err := devstack.Start(ctx, opts)
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while starting
		}
		return err
	}
	printStack(out, st)

	return serveStack(ctx, out, st, *f.readyTimeout)
}

// devFlags are the flags of tether dev.
type devFlags struct {
	edges, ctxWorkers, genWorkers, ranks, port, natsPort, maxModelLen, maxLoRAs     *int
	dataDir, adminToken, scope, model, models, loraAdapters, logLevel, engineEvents *string
	timeScale                                                                       *float64
	debugRoute, plaintext, flowControl                                              *bool
	readyTimeout                                                                    *time.Duration
}

func newDevFlags(fs *flag.FlagSet) *devFlags {
	return &devFlags{
		edges:      fs.Int("edges", devstack.DefaultEdges, "number of edges (Raft voters)"),
		ctxWorkers: fs.Int("context-workers", devstack.DefaultContextWorkers, "number of context (prefill) workers; with --generation-workers 0, the aggregated workers"),
		genWorkers: fs.Int("generation-workers", devstack.DefaultGenerationWorkers, "number of generation (decode) workers; 0: one aggregated fleet (the context workers serve whole requests, prefill and decode on one worker, as aggregated vLLM and SGLang servers do)"),
		ranks:      fs.Int("ranks", devstack.DefaultRanks, "attention-DP ranks per worker"),
		port:       fs.Int("port", edge.DefaultPort, "first edge's HTTP port; the others follow (0: free ports for all)"),
		natsPort:   fs.Int("nats-port", 0, "embedded NATS server's port (0: a free port)"),
		dataDir:    fs.String("data-dir", "", "keep Raft logs, snapshots and archives here across runs (default: a temporary directory removed on exit)"),
		adminToken: fs.String("admin-token", "", "admin API bearer token (default: $"+edge.EnvAdminToken+", else random)"),
		scope:      fs.String("scope", "context", "subagent_affinity_scope: context or both"),
		timeScale:  fs.Float64("time-scale", 0.1, "simulated engine wall time per engine second (1 real time, 0 instant)"),
		debugRoute: fs.Bool("debug-route-header", true, "answer with the x-tether-route header naming the instances and ranks used"),
		model: fs.String("model", strings.Join(append([]string{devstack.DefaultModel}, devstack.DefaultModelAliases...), ","),
			"the model the stack serves: its name, or several names of it separated by commas (the first is its name, the others aliases requests may give, as vLLM's --served-model-name); the default's second name is the OpenAI Agents SDK's default model"),
		models:       fs.String("models", "", "comma-separated models the stack serves, each on its own context and generation workers (the first replaces --model, names and all)"),
		maxModelLen:  fs.Int("max-model-len", worker.DefaultMaxModelLen, "the simulated workers' context length (max_model_len, vLLM's --max-model-len): prompt plus max_tokens beyond it is refused as vLLM refuses it"),
		loraAdapters: fs.String("lora-adapters", "", "comma-separated LoRA adapters as model:adapter (e.g. tether-sim:agent-a); the model's workers serve them"),
		maxLoRAs:     fs.Int("max-loras", 2, "LoRA adapter slots per ADP rank of the simulated engine (vLLM --max-loras)"),
		readyTimeout: fs.Duration("ready-timeout", 60*time.Second, "give up if the stack is not ready within this long"),
		logLevel:     fs.String("log-level", "warn", "log level on standard error: debug, info, warn or error"),
		plaintext:    fs.Bool("plaintext", false, "run without TLS (default: mutual TLS everywhere with an ephemeral CA in the data dir)"),
		flowControl: fs.Bool("flow-control", false, "fair, fleet-wide admission (flow_control.enabled): requests the fleet cannot start wait at the edges and leave fairly across tenants (x-tether-tenant, else the API key); "+
			"beyond a band's max_wait they get 429 (529 on /v1/messages) with Retry-After"),
		engineEvents: fs.String("engine-events", "", "vllm: run the workers as proxies in front of simulated engines publishing vLLM-format ZeroMQ KV events (the real-engine path); empty: the simulated engine in each worker"),
	}
}

// options checks the flags and returns the stack they describe.
func (f *devFlags) options() (devstack.Options, error) {
	names, extraModels, err := devModels(*f.model, *f.models)
	if err != nil {
		return devstack.Options{}, err
	}
	sc, err := routing.ParseScope(*f.scope)
	if err != nil {
		return devstack.Options{}, fmt.Errorf("%w: --scope: %v", errUsage, err)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*f.logLevel)); err != nil {
		return devstack.Options{}, fmt.Errorf("%w: --log-level: %v", errUsage, err)
	}
	if *f.readyTimeout <= 0 {
		return devstack.Options{}, fmt.Errorf("%w: --ready-timeout must be positive, got %s", errUsage, *f.readyTimeout)
	}
	token := *f.adminToken
	if token == "" {
		token = os.Getenv(edge.EnvAdminToken)
	}
	if *f.maxModelLen < 2 {
		return devstack.Options{}, fmt.Errorf("%w: --max-model-len must be at least 2, got %d", errUsage, *f.maxModelLen)
	}
	adapters, err := parseAdapters(*f.loraAdapters)
	if err != nil {
		return devstack.Options{}, err
	}
	if *f.maxLoRAs < 1 {
		return devstack.Options{}, fmt.Errorf("%w: --max-loras must be at least 1, got %d", errUsage, *f.maxLoRAs)
	}
	opts := devstack.Options{
		Edges: *f.edges, ContextWorkers: *f.ctxWorkers, GenerationWorkers: *f.genWorkers, Ranks: *f.ranks, Aggregated: *f.genWorkers == 0,
		Port: *f.port, NATSPort: *f.natsPort, DataDir: *f.dataDir, AdminToken: token, Model: names[0], ModelAliases: names[1:], MaxModelLen: *f.maxModelLen,
		Scope: sc, TimeScale: *f.timeScale, HideRouteHeader: !*f.debugRoute, Version: version, MutualTLS: !*f.plaintext,
		EngineEvents: *f.engineEvents, ExtraModels: extraModels, Adapters: adapters, MaxLoRAs: *f.maxLoRAs,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	}
	if *f.flowControl {
		opts.EdgeConfig = func(_ int, c *edge.Config) { c.FlowControl.Enabled = true }
	}
	// Zero counts would silently mean "default" to devstack; on the
	// command line they are mistakes (--generation-workers 0 asks for the
	// aggregated fleet).
	for _, c := range []struct {
		name string
		v    int
	}{{"edges", *f.edges}, {"context-workers", *f.ctxWorkers}, {"ranks", *f.ranks}} {
		if c.v < 1 {
			return devstack.Options{}, fmt.Errorf("%w: --%s must be at least 1, got %d", errUsage, c.name, c.v)
		}
	}
	if *f.genWorkers < 0 {
		return devstack.Options{}, fmt.Errorf("%w: --generation-workers must be 0 (an aggregated fleet) or more, got %d", errUsage, *f.genWorkers)
	}
	if err := opts.Normalize(); err != nil {
		return devstack.Options{}, fmt.Errorf("%w: %v", errUsage, err)
	}
	return opts, nil
}

// topology names the stack's workers for the banner: "2 context + 2
// generation workers (4 ADP ranks each)", "2 aggregated workers serving
// whole requests (…)".
func topology(o devstack.Options) string {
	each := plural(o.Ranks, "ADP rank") + " each"
	if o.EngineEvents != "" {
		each += "; proxies in front of simulated engines publishing " + o.EngineEvents + " KV events"
	}
	if o.Aggregated {
		return fmt.Sprintf("%s serving whole requests (%s)", plural(o.ContextWorkers, "aggregated worker"), each)
	}
	return fmt.Sprintf("%d context + %d generation workers (%s)", o.ContextWorkers, o.GenerationWorkers, each)
}

// devModels reads --model (the first model's names) and --models (every
// model, one name each; the first replaces --model).
func devModels(model, models string) (names, extra []string, err error) {
	names = splitList(model)
	if len(names) == 0 {
		return nil, nil, fmt.Errorf("%w: --model names no model", errUsage)
	}
	if models == "" {
		return names, nil, nil
	}
	list := splitList(models)
	if len(list) == 0 {
		return nil, nil, fmt.Errorf("%w: --models names no model", errUsage)
	}
	return list[:1], list[1:], nil
}

// parseAdapters reads --lora-adapters: model:adapter items, by model.
func parseAdapters(list string) (map[string][]string, error) {
	var adapters map[string][]string
	for _, ma := range splitList(list) {
		m, a, ok := strings.Cut(ma, ":")
		if !ok || m == "" || a == "" {
			return nil, fmt.Errorf("%w: --lora-adapters: %q is not model:adapter", errUsage, ma)
		}
		if adapters == nil {
			adapters = map[string][]string{}
		}
		adapters[m] = append(adapters[m], a)
	}
	return adapters, nil
}

// serveStack waits up to readyTimeout for the started stack to be ready,
// serves until ctx ends and shuts the stack down.
func serveStack(ctx context.Context, out io.Writer, st *devstack.Stack, readyTimeout time.Duration) error {
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	err := st.WaitReady(rctx)
	cancel()
	switch {
	case err != nil && ctx.Err() != nil:
		// Interrupted before ready: a normal shutdown.
	case err != nil:
		return errors.Join(fmt.Errorf("not ready after %s: %w", readyTimeout, err), shutdownStack(out, st))
	default:
		leader := "?"
		if l := st.Leader(); l != nil {
			leader = l.ID
		}
		fmt.Fprintf(out, "tether dev: ready (leader %s; %d workers healthy on every edge). Ctrl-C stops.\n", leader, len(st.Workers()))
		<-ctx.Done()
	}
	return shutdownStack(out, st)
}

func shutdownStack(out io.Writer, st *devstack.Stack) error {
	fmt.Fprintln(out, "tether dev: shutting down (workers drain, edges hand over leadership, NATS stops)")
	ctx, cancel := context.WithTimeout(context.Background(), devShutdownGrace)
	defer cancel()
	if err := st.Close(ctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	fmt.Fprintln(out, "tether dev: stopped")
	return nil
}

// printStack writes the endpoints, the secrets a developer needs and
// example requests.
func printStack(out io.Writer, st *devstack.Stack) {
	line := func(name, value string) { fmt.Fprintf(out, "%-12s %s\n", name+":", value) }
	dd := st.DataDir() + " (kept: restart with the same --data-dir to recover the bindings)"
	if st.TemporaryDataDir() {
		dd = st.DataDir() + " (temporary, removed on exit)"
	}
	line("data dir", dd)
	if ca := st.CAFile(); ca != "" {
		line("ca cert", ca+"  (every node's certificate chains to it: curl --cacert, SSL_CERT_FILE, NODE_EXTRA_CA_CERTS; see README)")
	} else {
		line("tls", "off (--plaintext)")
	}
	line("nats", st.NATSURL())
	for _, n := range st.Edges() {
		line(n.ID, n.URL()+"  raft "+n.RaftAddr)
	}
	for _, w := range st.Workers() {
		role := w.Fleet.String() + " worker"
		if st.Options().Aggregated {
			role = "aggregated worker (the context fleet)"
		}
		line(w.ID, w.URL()+"  "+role+" of "+w.Model)
	}
	if as := st.ModelAliases(); len(as) > 0 {
		line("model", st.Model()+"  (also served as "+strings.Join(as, ", ")+")")
	}
	if o := st.Options(); len(st.Models()) > 1 || len(o.Adapters) > 0 {
		var ms []string
		for _, m := range st.Models() {
			if as := o.Adapters[m]; len(as) > 0 {
				m += " (LoRA adapters " + strings.Join(as, ", ") + fmt.Sprintf("; %d slots per rank)", o.MaxLoRAs)
			}
			ms = append(ms, m)
		}
		line("models", strings.Join(ms, ", "))
	}
	line("admin token", st.AdminToken()+adminTokenNote(st.AdminTokenSource(), st.TemporaryDataDir()))
	fmt.Fprint(out, banner(st.Edges(), st.Model(), st.CAFile(), st.AdminToken(), st.Options().Aggregated))
}

// adminTokenNote says where the printed admin token came from (source as
// devstack.Stack.AdminTokenSource) and whether it outlives this run.
func adminTokenNote(source string, tempDir bool) string {
	switch {
	case source == "given":
		return "  (from --admin-token or $" + edge.EnvAdminToken + "; not stored)"
	case tempDir:
		return "  (random, for this run: the temporary data dir is removed on exit; --admin-token or $" + edge.EnvAdminToken + " sets one)"
	case source == "kept":
		return "  (kept in the data dir from an earlier run; --admin-token or $" + edge.EnvAdminToken + " wins)"
	}
	return "  (random, kept in the data dir for the next start; --admin-token or $" + edge.EnvAdminToken + " wins)"
}

// plural is "1 edge", "3 edges".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// banner is the example printed at startup: a parent conversation, then
// its sub-agent re-sending the same 300-token system prompt (4 whole
// 64-token blocks), so the second answer shows the cache hit on the
// parent's context instance (aggregated: the one instance that serves the
// whole request). With several edges the sub-agent goes to another edge,
// which routes it the same way.
func banner(edges []*devstack.EdgeNode, model, caFile, token string, aggregated bool) string {
	first, second := edges[0], edges[0]
	where := "on " + first.ID + ", then its sub-agent on the same edge"
	if len(edges) > 1 {
		second = edges[1]
		where = "on " + first.ID + ", then its sub-agent on " + second.ID
	}
	cacert := ""
	var b strings.Builder
	fmt.Fprintf(&b, "\nA parent conversation %s.\n", where)
	fmt.Fprintf(&b, "The sub-agent re-sends the parent's 300-token system prompt: it lands on the same\n")
	if aggregated {
		fmt.Fprintf(&b, "instance (x-tether-route: context=<instance/rank>; generation=-, one hop to the\n")
		fmt.Fprintf(&b, "aggregated fleet) and its usage reports cached_tokens for the prompt's whole\n")
		fmt.Fprintf(&b, "64-token blocks:\n\n")
	} else {
		fmt.Fprintf(&b, "context instance (x-tether-route) and its usage reports cached_tokens for the\n")
		fmt.Fprintf(&b, "prompt's whole 64-token blocks:\n\n")
	}
	if caFile != "" {
		fmt.Fprintf(&b, "  CA=%s\n", caFile)
		cacert = "--cacert $CA "
	}
	fmt.Fprintf(&b, "  TOKEN=%s\n", token)
	fmt.Fprintf(&b, "  SYS=$(printf 'tool-%%d ' $(seq 1 300))\n\n")
	req := func(edge *devstack.EdgeNode, session, extra, user string) {
		fmt.Fprintf(&b, "  curl -si %s%s/v1/chat/completions -H 'Content-Type: application/json' \\\n", cacert, edge.URL())
		fmt.Fprintf(&b, "    -H 'x-session-id: %s'%s \\\n", session, extra)
		fmt.Fprintf(&b, "    -d '{\"model\":%q,\"max_tokens\":8,\"messages\":[{\"role\":\"system\",\"content\":\"'\"$SYS\"'\"},{\"role\":\"user\",\"content\":%q}]}'\n\n", model, user)
	}
	req(first, "parent-1", "", "plan the work")
	req(second, "child-a", " -H '"+devstack.ParentHeader+": parent-1'", "explore package routing")
	fmt.Fprintf(&b, "  curl -s %s-H \"Authorization: Bearer $TOKEN\" %s/admin/v1/bindings/context/parent-1\n\n", cacert, edges[len(edges)-1].URL())
	return b.String()
}

// splitList splits a comma-separated flag value, dropping blanks.
func splitList(v string) []string {
	var out []string
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
