package chaos

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"gopkg.in/yaml.v3"

	"github.com/tether-project/tether/cluster/pki"
)

// The harness runs the configurations deploy/ ships (test as deployed): each edge reads deploy/config/edge-N.yaml, each worker
// deploy/config/worker-{context,generation}.yaml, and the NATS server
// deploy/nats/nats-1.conf with its auth.conf. Only what a deployment
// substitutes is changed — addresses and ports, data directories,
// certificate paths (a CA of the test's), secrets (from the environment, as
// deploy/README.md says), the NATS worker nkey and edge password, the
// trusted gateway's network (loopback) — plus what a test needs to see:
// debug_route_header (the checker reads x-tether-route) and the simulated
// engine in place of the workers' proxy upstreams. A test may override more
// (envOptions.edge), and says why.
var deployDir = filepath.Join("..", "..", "deploy")

// The edge's NATS password replaces the shipped one; each worker's NATS
// identity is an nkey generated per run (workerNKeys), whose public half
// replaces that worker's in deploy/nats/auth.conf.
const (
	shippedEdgePassword  = "edge-nats-password-change-me"
	testNATSEdgePassword = "chaos-nats-edge-password-0123456789"
	clusterAuthKey       = "chaos-cluster-auth-key-0123456789"
)

// workerNKeys generates an nkey per worker id; the seeds go to the
// workers' nkey_seed_file, the public keys into auth.conf.
func workerNKeys(t *testing.T, ids []string) map[string]nkeys.KeyPair {
	t.Helper()
	out := map[string]nkeys.KeyPair{}
	for _, id := range ids {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		out[id] = kp
	}
	return out
}

// seedOf is kp's seed, as an nkey_seed_file holds it.
func seedOf(t *testing.T, kp nkeys.KeyPair) string {
	t.Helper()
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	return string(seed)
}

// shippedWorkerNKeys maps each worker id of deploy/nats/auth.conf to its
// shipped public nkey (the id is the one in the user's kv subject).
func shippedWorkerNKeys(t *testing.T) map[string]string {
	t.Helper()
	o, err := natsserver.ProcessConfigFile(filepath.Join(deployDir, "nats", "nats-1.conf"))
	if err != nil {
		t.Fatalf("deploy/nats/nats-1.conf: %v", err)
	}
	out := map[string]string{}
	for _, u := range o.Nkeys {
		if u.Permissions == nil || u.Permissions.Publish == nil {
			continue
		}
		for _, s := range u.Permissions.Publish.Allow {
			if id, ok := strings.CutPrefix(s, "tether.v1.kv."); ok && !strings.ContainsAny(id, "*>") {
				out[id] = u.Nkey
			}
		}
	}
	return out
}

// secretsEnv is the environment deploy/README.md's secrets come from.
func secretsEnv() []string {
	return []string{
		"TETHER_ADMIN_TOKEN=" + adminToken,
		"TETHER_INTERNAL_REQUEST_AUTH_KEY=" + internalKey,
		"TETHER_CLUSTER_AUTH_KEY=" + clusterAuthKey,
		"TETHER_NATS_PASSWORD=" + testNATSEdgePassword,
		"TETHER_NATS_TOKEN=",
	}
}

// readDeployYAML decodes deploy/<rel> into a generic mapping.
func readDeployYAML(t *testing.T, rel string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deployDir, rel))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatalf("deploy/%s: %v", rel, err)
	}
	return m
}

// yamlSet sets the dotted path in m (creating mappings on the way); a nil
// value deletes the key.
func yamlSet(t *testing.T, m map[string]any, path string, v any) {
	t.Helper()
	parts := strings.Split(path, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p]
		if !ok || next == nil {
			next = map[string]any{}
			m[p] = next
		}
		sub, ok := next.(map[string]any)
		if !ok {
			t.Fatalf("deploy config: %s: %s is not a mapping", path, p)
		}
		m = sub
	}
	if v == nil {
		delete(m, parts[len(parts)-1])
		return
	}
	m[parts[len(parts)-1]] = v
}

// yamlGet reads a string at the dotted path ("" when absent).
func yamlGet(m map[string]any, path string) string {
	parts := strings.Split(path, ".")
	var cur any = m
	for _, p := range parts {
		mm, ok := cur.(map[string]any)
		if !ok {
			return ""
		}
		cur = mm[p]
	}
	s, _ := cur.(string)
	return s
}

// writeDeployConfig applies set to deploy/<rel> and writes it to dst.
func writeDeployConfig(t *testing.T, rel, dst string, set map[string]any) {
	t.Helper()
	m := readDeployYAML(t, rel)
	for k, v := range set {
		yamlSet(t, m, k, v)
	}
	b, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, append([]byte("# written by test/chaos from deploy/"+rel+"\n"), b...), 0o600); err != nil {
		t.Fatal(err)
	}
}

// testPKI is the deployment's CA (deploy/README.md: every link runs mutual
// TLS with certificates from one CA) and its files.
type testPKI struct {
	ca     *pki.CA
	dir    string
	caFile string
}

func newTestPKI(t *testing.T, dir string) *testPKI {
	t.Helper()
	ca, err := pki.NewCA("chaos-ca", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir = filepath.Join(dir, "tls")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	caFile, err := ca.WriteCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{ca: ca, dir: dir, caFile: caFile}
}

// issue writes id's certificate in role (loopback hosts and any others
// given) and returns its files.
func (p *testPKI) issue(t *testing.T, id string, role pki.Role, hosts ...string) pki.Files {
	t.Helper()
	leaf, err := p.ca.Issue(id, pki.IssueOptions{Role: role, Hosts: append([]string{"127.0.0.1", "localhost"}, hosts...)})
	if err != nil {
		t.Fatal(err)
	}
	f, err := p.ca.WriteFiles(p.dir, id, leaf)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// clientTLS trusts the CA (the agent gateway's and operators' view: no
// client certificate, deploy's edges do not require one on HTTP).
func (p *testPKI) clientTLS() *tls.Config {
	return &tls.Config{RootCAs: p.ca.Pool(), MinVersion: tls.VersionTLS12}
}

// natsOptions builds the NATS server's options from deploy/nats/nats-1.conf
// and auth.conf: one server listening on listen (host:port; no cluster
// routes, no monitoring port), the shipped users and permissions with the
// test's edge password and each worker's nkey (workers: id → key pair;
// every id must be one auth.conf pins). The files are written to
// <dir>/nats (nats.conf, auth.conf).
func natsOptions(t *testing.T, dir string, listen string, workers map[string]nkeys.KeyPair) *natsserver.Options {
	t.Helper()
	dst := filepath.Join(dir, "nats")
	if err := os.MkdirAll(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(deployDir, "nats", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	auth := read("auth.conf")
	subst := []struct{ from, to string }{{shippedEdgePassword, testNATSEdgePassword}}
	shipped := shippedWorkerNKeys(t)
	for id, kp := range workers {
		pub, err := kp.PublicKey()
		if err != nil {
			t.Fatal(err)
		}
		if shipped[id] == "" {
			t.Fatalf("deploy/nats/auth.conf pins no nkey to worker %s: update test/chaos/deploy_test.go", id)
		}
		subst = append(subst, struct{ from, to string }{shipped[id], pub})
	}
	for _, r := range subst {
		if !strings.Contains(auth, r.from) {
			t.Fatalf("deploy/nats/auth.conf no longer holds %q: update test/chaos/deploy_test.go", r.from)
		}
		auth = strings.ReplaceAll(auth, r.from, r.to)
	}
	conf := read("nats-1.conf")
	listenLine := regexp.MustCompile(`(?m)^listen: .*$`)
	if !listenLine.MatchString(conf) {
		t.Fatal("deploy/nats/nats-1.conf has no listen line")
	}
	conf = listenLine.ReplaceAllString(conf, "listen: "+listen)
	conf = regexp.MustCompile(`(?m)^http: .*$`).ReplaceAllString(conf, "")
	conf = regexp.MustCompile(`(?s)\ncluster \{.*?\n\}\n`).ReplaceAllString(conf, "\n")
	for name, text := range map[string]string{"auth.conf": auth, "nats.conf": conf} {
		if err := os.WriteFile(filepath.Join(dst, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	opts, err := natsserver.ProcessConfigFile(filepath.Join(dst, "nats.conf"))
	if err != nil {
		t.Fatalf("deploy/nats/nats-1.conf as the test runs it: %v", err)
	}
	opts.NoLog, opts.NoSigs = true, true
	return opts
}
