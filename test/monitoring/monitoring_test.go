package monitoring

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metricsql"
	"gopkg.in/yaml.v3"

	"github.com/tether-project/tether/ops/devstack"
	"github.com/tether-project/tether/test/leakcheck"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := leakcheck.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "test/monitoring: goroutines left running: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	deployDir = filepath.Join("..", "..", "deploy")
	rulesFile = filepath.Join(deployDir, "prometheus", "tether-rules.yaml")
)

// binaries finds prometheus and promtool (installing Debian's package where
// it can); it skips only outside CI.
func binaries(t *testing.T) (prometheus, promtool string) {
	t.Helper()
	prometheus, promtool, err := Binaries()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs a real Prometheus: %v", err)
		}
		t.Skipf("no Prometheus here: %v", err)
	}
	return prometheus, promtool
}

// ruleFile is deploy/prometheus/tether-rules.yaml.
type ruleFile struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval"`
		Rules    []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Record string `yaml:"record"`
	Alert  string `yaml:"alert"`
	Expr   string `yaml:"expr"`
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(data, &rf); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return rf
}

// The rules pass promtool's checks and unit tests, and the unit tests make
// every alert fire at least once.
func TestRulesPassPromtool(t *testing.T) {
	_, promtool := binaries(t)
	dir := filepath.Join(deployDir, "prometheus")
	for _, args := range [][]string{{"check", "rules", "tether-rules.yaml"}, {"test", "rules", "tether-rules.test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, "tether-rules.test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(data, &tests); err != nil {
		t.Fatal(err)
	}
	fires := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			}
		}
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert != "" && !fires[r.Alert] {
				t.Errorf("alert %s: no case in tether-rules.test.yaml makes it fire", r.Alert)
			}
		}
	}
}

// query is one expression to judge, and where it comes from.
type query struct {
	where string
	expr  string
}

// dashboardQueries are the targets of every panel of every dashboard in
// deploy/grafana, with Grafana's variables given the values a user sees with
// "All" selected and a 1-minute rate interval.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployDir, "grafana", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in deploy/grafana (%v)", err)
	}
	vars := strings.NewReplacer("$__rate_interval", "1m", "$__interval", "1m", "$fleet", ".*", "$instance", ".*")
	var out []query
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d dashboard
		if err := json.Unmarshal(data, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if d.UID == "" || d.Title == "" {
			t.Errorf("%s: a dashboard needs a uid and a title", f)
		}
		n := 0
		for _, p := range d.all() {
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("%s: panel %q has a target without an expression", f, p.Title)
					continue
				}
				if tg.Datasource.UID != "${datasource}" || p.Datasource.UID != "${datasource}" {
					t.Errorf("%s: panel %q: data source %q, want the ${datasource} variable", f, p.Title, tg.Datasource.UID)
				}
				out = append(out, query{where: fmt.Sprintf("%s panel %q", filepath.Base(f), p.Title), expr: vars.Replace(tg.Expr)})
				n++
			}
		}
		for _, v := range d.Templating.List {
			if v.Type == "query" {
				out = append(out, query{where: fmt.Sprintf("%s variable %s", filepath.Base(f), v.Name), expr: labelValuesQuery(t, vars.Replace(v.Definition))})
			}
		}
		if n == 0 {
			t.Errorf("%s: no panel queries", f)
		}
	}
	return out
}

type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Title      string  `json:"title"`
	Type       string  `json:"type"`
	Panels     []panel `json:"panels"`
	Datasource struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr       string `json:"expr"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
}

func (d dashboard) all() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type != "row" {
				out = append(out, p)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

var labelValues = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// labelValuesQuery turns a Grafana label_values(expr, label) variable into
// the query Grafana's Prometheus data source effectively makes: the series
// of expr (which must carry the label).
func labelValuesQuery(t *testing.T, def string) string {
	m := labelValues.FindStringSubmatch(strings.TrimSpace(def))
	if m == nil {
		t.Errorf("variable query %q: want label_values(expr, label)", def)
		return def
	}
	return fmt.Sprintf("count by (%s) (%s)", m[2], m[1])
}

// ruleQueries are the rules' expressions: a recording rule's expression and
// the series it records; for an alert, its signals (the operands of its
// comparisons with a threshold, and of and/or/unless), which exist on a
// healthy stack while the alert itself stays quiet.
func ruleQueries(t *testing.T, rf ruleFile) []query {
	t.Helper()
	var out []query
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			switch {
			case r.Record != "":
				out = append(out, query{where: "recording rule " + r.Record, expr: r.Expr}, query{where: "recorded series " + r.Record, expr: r.Record})
			case r.Alert != "":
				e, err := metricsql.Parse(r.Expr)
				if err != nil {
					t.Errorf("alert %s: %v", r.Alert, err)
					continue
				}
				sigs := signals(e)
				if len(sigs) == 0 {
					t.Errorf("alert %s: no signal in %q", r.Alert, r.Expr)
				}
				for _, s := range sigs {
					out = append(out, query{where: "alert " + r.Alert + " signal", expr: s})
				}
			}
		}
	}
	return out
}

func signals(e metricsql.Expr) []string {
	b, ok := e.(*metricsql.BinaryOpExpr)
	if !ok {
		return []string{string(e.AppendString(nil))}
	}
	switch {
	case b.Op == "and" || b.Op == "or" || b.Op == "unless":
		return append(signals(b.Left), signals(b.Right)...)
	case metricsql.IsBinaryOpCmp(b.Op) && !b.Bool:
		var out []string
		for _, side := range []metricsql.Expr{b.Left, b.Right} {
			if _, num := side.(*metricsql.NumberExpr); !num {
				out = append(out, signals(side)...)
			}
		}
		return out
	}
	return []string{string(e.AppendString(nil))}
}

// autoscalerQueries are the queries of deploy/kubernetes/autoscaling: the
// KEDA triggers' and the Prometheus adapter's (its template filled in as the
// adapter does for the HPA's selector).
func autoscalerQueries(t *testing.T) []query {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployDir, "kubernetes", "autoscaling", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no autoscaling examples (%v)", err)
	}
	var out []query
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var doc struct {
				Kind string `yaml:"kind"`
				Spec struct {
					Triggers []struct {
						Name     string            `yaml:"name"`
						Metadata map[string]string `yaml:"metadata"`
					} `yaml:"triggers"`
				} `yaml:"spec"`
				Data map[string]string `yaml:"data"`
			}
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			for _, tr := range doc.Spec.Triggers {
				out = append(out, query{where: filepath.Base(f) + " trigger " + tr.Name, expr: tr.Metadata["query"]})
			}
			if cfg, ok := doc.Data["config.yaml"]; ok {
				var ad struct {
					ExternalRules []struct {
						SeriesQuery  string `yaml:"seriesQuery"`
						MetricsQuery string `yaml:"metricsQuery"`
					} `yaml:"externalRules"`
				}
				if err := yaml.Unmarshal([]byte(cfg), &ad); err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				for _, r := range ad.ExternalRules {
					q := strings.NewReplacer("<<.Series>>", r.SeriesQuery, "<<.LabelMatchers>>", `fleet="context"`).Replace(r.MetricsQuery)
					out = append(out, query{where: filepath.Base(f) + " rule " + r.SeriesQuery, expr: q})
				}
			}
		}
	}
	return out
}

// The dashboards and rules on a real Prometheus: deploy/prometheus's
// configuration (targets, CA file and intervals substituted) scrapes a
// running dev stack with mutual TLS, and after agent traffic every dashboard
// query, every recording rule and every alert's signal returns at least one
// series.
func TestDashboardsAndRulesOnRealPrometheus(t *testing.T) {
	prom, _ := binaries(t)
	rf := loadRules(t)
	queries := append(append(dashboardQueries(t), ruleQueries(t, rf)...), autoscalerQueries(t)...)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	st, err := devstack.Start(ctx, devstack.Options{MutualTLS: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		if err := st.Close(cctx); err != nil {
			t.Error(err)
		}
	}()
	if err := st.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	writePromConfig(t, dir, st, rf)
	api := startPrometheus(t, ctx, prom, dir)

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: st.ClientTLS()}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	agentTraffic(t, client, st)

	// Every expression must come to return a series: scrapes every second
	// and rules evaluated every second, so within a few seconds; the
	// deadline is for a starved machine.
	pending := queries
	deadline := time.Now().Add(90 * time.Second)
	var failures []string
	for {
		failures = nil
		pending = judge(t, api, pending, &failures)
		if len(pending) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Second)
	}
	for _, f := range failures {
		t.Error(f)
	}
	t.Logf("%d expressions judged, %d without a series", len(queries), len(pending))
}

// judge runs each query and returns those without a series yet; errors in
// the query itself fail the test at once (a typo never comes right).
func judge(t *testing.T, api string, qs []query, failures *[]string) []query {
	var left []query
	for _, q := range qs {
		n, err := instantQuery(api, q.expr)
		var bad *badQuery
		if errors.As(err, &bad) {
			t.Errorf("%s: %q: %v", q.where, q.expr, err)
			continue
		}
		if err != nil || n == 0 {
			left = append(left, q)
			*failures = append(*failures, fmt.Sprintf("%s: %q returned no series (%v)", q.where, q.expr, err))
		}
	}
	return left
}

type badQuery struct{ msg string }

func (b *badQuery) Error() string { return b.msg }

func instantQuery(api, expr string) (int, error) {
	resp, err := http.Get(api + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Status    string `json:"status"`
		ErrorType string `json:"errorType"`
		Error     string `json:"error"`
		Data      struct {
			ResultType string            `json:"resultType"`
			Result     []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		if r.ErrorType == "bad_data" {
			return 0, &badQuery{r.Error}
		}
		return 0, fmt.Errorf("%s: %s", r.ErrorType, r.Error)
	}
	return len(r.Data.Result), nil
}

// writePromConfig writes deploy/prometheus/prometheus.yml into dir as
// written except: intervals of 1s (the shipped 15s and 30s would make the
// test wait minutes), the stack's edges and workers as targets, the stack's
// CA as ca_file, and the rules copied beside it with their group intervals
// at 1s.
func writePromConfig(t *testing.T, dir string, st *devstack.Stack, rf ruleFile) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployDir, "prometheus", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["global"] = map[string]any{"scrape_interval": "1s", "evaluation_interval": "1s"}
	cfg["rule_files"] = []any{"tether-rules.yaml"}
	var edges, workers []string
	for _, e := range st.Edges() {
		edges = append(edges, e.Addr())
	}
	for _, w := range st.Workers() {
		u, err := url.Parse(w.URL())
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, u.Host)
	}
	jobs, _ := cfg["scrape_configs"].([]any)
	seen := map[string]bool{}
	for _, j := range jobs {
		job := j.(map[string]any)
		name, _ := job["job_name"].(string)
		seen[name] = true
		targets := map[string][]string{"tether-edge": edges, "tether-worker": workers}[name]
		if targets == nil {
			t.Fatalf("prometheus.yml: unexpected job %q", name)
		}
		job["static_configs"] = []any{map[string]any{"targets": targets}}
		if tc, ok := job["tls_config"].(map[string]any); ok {
			tc["ca_file"] = st.CAFile()
		}
	}
	if !seen["tether-edge"] || !seen["tether-worker"] {
		t.Fatalf("prometheus.yml: want jobs tether-edge and tether-worker, have %v", seen)
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	fast := rf
	for i := range fast.Groups {
		fast.Groups[i].Interval = "1s"
	}
	rules, err := yaml.Marshal(fast)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tether-rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
}

var listening = regexp.MustCompile(`msg="Listening on" address=(\S+)`)

// startPrometheus runs prometheus on a free loopback port with its data in
// dir and returns its base URL once it answers ready; it is killed when the
// test ends.
func startPrometheus(t *testing.T, ctx context.Context, bin, dir string) string {
	t.Helper()
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:0",
		"--storage.tsdb.retention.time=1h", "--log.level=info")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	addr := make(chan string, 1)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			logs.WriteString(line + "\n")
			if m := listening.FindStringSubmatch(line); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-copied
		cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", tail(logs.Bytes()))
		}
	})
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case <-copied:
		t.Fatalf("prometheus exited before listening")
	case <-ctx.Done():
		t.Fatalf("prometheus did not listen: %v", ctx.Err())
	}
	for {
		resp, err := http.Get(base + "/-/ready")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("prometheus not ready: %v", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// agentTraffic sends agent conversations through every edge: parents with
// a long shared system prompt (so later turns and sub-agents hit the cache)
// and sub-agents carrying the parent header, on both fleets.
func agentTraffic(t *testing.T, c *http.Client, st *devstack.Stack) {
	t.Helper()
	sys := strings.Repeat("you are a careful coding agent with tools; ", 40)
	edges := st.Edges()
	n := 0
	send := func(session, parent, user string) {
		body, _ := json.Marshal(map[string]any{
			"model": st.Model(), "max_tokens": 4,
			"messages": []map[string]string{{"role": "system", "content": sys}, {"role": "user", "content": user}},
		})
		e := edges[n%len(edges)]
		n++
		req, _ := http.NewRequest(http.MethodPost, e.URL()+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-session-id", session)
		if parent != "" {
			req.Header.Set(devstack.ParentHeader, parent)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", session, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s via %s: HTTP %d: %s", session, e.Addr(), resp.StatusCode, b)
		}
	}
	for round := range 3 {
		for p := range 6 {
			parent := fmt.Sprintf("parent-%d", p)
			send(parent, "", fmt.Sprintf("plan step %d", round))
			for c := range 2 {
				send(fmt.Sprintf("%s-child-%d", parent, c), parent, fmt.Sprintf("explore part %d.%d", round, c))
			}
		}
	}
	if !slices.ContainsFunc(edges, func(e *devstack.EdgeNode) bool { return e.Running() }) {
		t.Fatal("no edge running")
	}
}
