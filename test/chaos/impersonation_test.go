package chaos

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/cluster/pki"
	"github.com/tether-project/tether/internal/telemetry"
)

// TestChaosImpersonatedWorker: a worker's address is trusted only from the
// worker's own identity. The deployment runs as shipped (per-worker NATS
// nkeys pinned to their instance ids by deploy/nats/auth.conf, mutual TLS
// with a certificate per worker). An impostor HTTPS server presents ctx-2's
// certificate (valid, from the deployment's CA, for the loopback host it
// listens on) and forged load reports name ctx-1 at the impostor's address,
// with a new boot id (the newest boot id used to win):
//
//   - published with ctx-2's nkey, the NATS server refuses them
//     (permissions violation): a worker cannot speak for another;
//   - published with ctx-1's own nkey (a leaked NATS credential, or a
//     NATS identity shared by all workers), the edges refuse the address:
//     the impostor cannot prove ctx-1's identity, so ctx-1's reports from
//     there are dropped and counted, ctx-1 keeps its address and its
//     traffic, and no request reaches the impostor.
//
// Before the edges checked identities, 43 of 44 requests routed to ctx-1
// reached such an impostor while clients were told context=ctx-1.
// Forgery lasts 4 s (20 s with -long / RELIABILITY_LONG).
func TestChaosImpersonatedWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process: not in -short")
	}
	forgeFor := 4 * time.Second
	if longMode() {
		forgeFor = 20 * time.Second
	}
	v := newEnv(t)

	imp := startImpostor(t, v, "ctx-2")
	defer imp.close()

	// Conversations bound to ctx-1 (the context key is the root session).
	cl := &http.Client{Transport: v.transport(32), Timeout: 10 * time.Second}
	defer cl.Transport.(*http.Transport).CloseIdleConnections()
	var convs []string
	for i := 0; len(convs) < 8; i++ {
		if i > 200 {
			t.Fatalf("no conversation bound to ctx-1 in %d tries", i)
		}
		conv := fmt.Sprintf("imp-%d-%d", time.Now().UnixNano()%1e6, i)
		st, route, err := chatOnce(cl, v.edges[i%len(v.edges)], conv, 0)
		if err != nil || st != 200 {
			t.Fatalf("warm-up request %s: HTTP %d %v", conv, st, err)
		}
		if c, _ := parseRoute(route); c == "ctx-1" {
			convs = append(convs, conv)
		}
	}

	// A real ctx-1 report to forge from (what the edges accept from ctx-1).
	edgeNC, err := nats.Connect(v.natsURL, nats.UserInfo("edge", testNATSEdgePassword))
	if err != nil {
		t.Fatal(err)
	}
	defer edgeNC.Close()
	realReport := make(chan telemetry.LoadReport, 1)
	sub, err := edgeNC.Subscribe(telemetry.LoadSubject(telemetry.FleetContext, "ctx-1"), func(m *nats.Msg) {
		if r, err := telemetry.DecodeLoad(m.Subject, m.Data); err == nil {
			select {
			case realReport <- r:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	var forged telemetry.LoadReport
	select {
	case forged = <-realReport:
	case <-time.After(10 * time.Second):
		t.Fatal("no load report from ctx-1")
	}
	_ = sub.Unsubscribe()
	realURL := forged.URL
	forged.URL = imp.url
	forged.BootID++

	// ctx-2's identity may not publish for ctx-1.
	violations := make(chan error, 16)
	ctx2NC, err := nats.Connect(v.natsURL, nats.Nkey(mustPublic(t, v, "ctx-2"), v.nkeys["ctx-2"].Sign),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case violations <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer ctx2NC.Close()
	publishReport(t, ctx2NC, forged)
	select {
	case err := <-violations:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Errorf("ctx-2 publishing as ctx-1: %v, want a permissions violation", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the NATS server let ctx-2's identity publish a load report on ctx-1's subject")
	}

	// ctx-1's own NATS identity, misused: reports give ctx-1 the
	// impostor's address while ctx-1's traffic goes on.
	ctx1NC, err := nats.Connect(v.natsURL, nats.Nkey(mustPublic(t, v, "ctx-1"), v.nkeys["ctx-1"].Sign))
	if err != nil {
		t.Fatal(err)
	}
	defer ctx1NC.Close()
	stopForge := make(chan struct{})
	var forgedSent atomic.Int64
	var fwg sync.WaitGroup
	fwg.Add(1)
	go func() {
		defer fwg.Done()
		tick := time.NewTicker(time.Duration(max(forged.IntervalMilli, 20)) * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopForge:
				return
			case <-tick.C:
			}
			forged.Seq++
			forged.SentUnixMilli = time.Now().UnixMilli()
			publishReport(t, ctx1NC, forged)
			forgedSent.Add(1)
		}
	}()

	type answer struct {
		status int
		ctx    string
		err    string
	}
	var mu sync.Mutex
	var answers []answer
	deadline := time.Now().Add(forgeFor)
	var cwg sync.WaitGroup
	for w, conv := range convs {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			for turn := 1; time.Now().Before(deadline); turn++ {
				st, route, err := chatOnce(cl, v.edges[(w+turn)%len(v.edges)], conv, turn)
				a := answer{status: st}
				a.ctx, _ = parseRoute(route)
				if err != nil {
					a.err = err.Error()
				}
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
			}
		}()
	}
	cwg.Wait()
	close(stopForge)
	fwg.Wait()

	ok, onCtx1, other := 0, 0, map[string]int{}
	for _, a := range answers {
		switch {
		case a.status == 200 && a.ctx == "ctx-1":
			ok++
			onCtx1++
		case a.status == 200:
			ok++
			other["200 context="+a.ctx]++
		default:
			other[fmt.Sprintf("HTTP %d %s", a.status, a.err)]++
		}
	}
	refused := 0
	for _, e := range v.edges {
		refused += int(v.metric(e, "tether_edge_telemetry_dropped_total", `reason="address_refused"`))
	}
	addrFailed := 0
	for _, e := range v.edges {
		addrFailed += int(v.metric(e, "tether_edge_worker_address_refused_total"))
	}
	hits, sample := imp.seen()
	t.Logf("FIGURES impersonation forge_seconds=%.0f forged_reports=%d requests=%d answered_200=%d served_by_ctx1=%d other=%v impostor_requests=%d reports_refused=%d address_checks_failed=%d",
		forgeFor.Seconds(), forgedSent.Load(), len(answers), ok, onCtx1, other, hits, refused, addrFailed)
	if hits != 0 {
		t.Errorf("the impostor received %d requests (first: %s)", hits, sample)
	}
	if ok != len(answers) {
		t.Errorf("%d of %d requests for conversations bound to ctx-1 were not answered 200: %v", len(answers)-ok, len(answers), other)
	}
	// ctx-1 kept its own address on every edge (a request the load made
	// take another instance, a retry or an overflow, is no fault here).
	for _, e := range v.edges {
		if got := v.instanceURL(e, "ctx-1"); got != realURL {
			t.Errorf("%s gives ctx-1 the address %q after the forgery, want its own %s", e.id, got, realURL)
		}
	}
	if refused == 0 || addrFailed == 0 {
		t.Errorf("the forged address was not counted refused (reports refused %d, failed checks %d)", refused, addrFailed)
	}
}

// impostor is an HTTPS server presenting another worker's certificate; it
// records every request it receives.
type impostor struct {
	url  string
	srv  *http.Server
	mu   sync.Mutex
	hits int
	desc string
}

func startImpostor(t *testing.T, v *env, as string) *impostor {
	t.Helper()
	leaf, err := v.pki.ca.Issue(as, pki.IssueOptions{Role: pki.RoleWorker, Hosts: []string{"127.0.0.1", "localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := v.pki.ca.MutualTLS(leaf)
	cfg.ClientAuth = tls.VerifyClientCertIfGiven
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	imp := &impostor{url: "https://" + ln.Addr().String()}
	imp.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<16))
		if r.URL.Path != "/healthz" && r.URL.Path != "/readyz" {
			imp.mu.Lock()
			imp.hits++
			if imp.desc == "" {
				imp.desc = fmt.Sprintf("%s %s %.200s", r.Method, r.URL.Path, b)
			}
			imp.mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":{"message":"impostor","type":"server_error"}}`))
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = imp.srv.Serve(ln) }()
	return imp
}

func (i *impostor) seen() (int, string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.hits, i.desc
}

func (i *impostor) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = i.srv.Shutdown(ctx)
}

func mustPublic(t *testing.T, v *env, id string) string {
	t.Helper()
	pub, err := v.nkeys[id].PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

func publishReport(t *testing.T, nc *nats.Conn, r telemetry.LoadReport) {
	b, err := telemetry.EncodeLoad(r)
	if err != nil {
		t.Error(err)
		return
	}
	_ = nc.Publish(telemetry.LoadSubject(r.Fleet, r.Instance), b)
	_ = nc.Flush()
}

// chatOnce sends one turn of conv to e and returns the status and the
// x-tether-route header.
func chatOnce(c *http.Client, e *edgeProc, conv string, turn int) (int, string, error) {
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 2,
		"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("%s turn %d", conv, turn)}}})
	req, _ := http.NewRequest("POST", e.url()+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-session-id", conv)
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("x-tether-route"), nil
}

// metric sums the samples of a series of e's /metrics whose labels
// contain every one of match (metricSum); -1 when unreadable.
func (v *env) metric(e *edgeProc, name string, match ...string) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := v.metricSum(ctx, e, name, match...)
	if err != nil {
		return -1
	}
	return n
}

// instanceURL is the address e routes instance id to (admin instances).
func (v *env) instanceURL(e *edgeProc, id string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var resp struct {
		Instances []struct {
			ID  string `json:"id"`
			URL string `json:"url"`
		} `json:"instances"`
	}
	if err := v.admin(ctx, e, "instances", &resp); err != nil {
		return "unreadable: " + err.Error()
	}
	for _, in := range resp.Instances {
		if in.ID == id {
			return in.URL
		}
	}
	return ""
}
