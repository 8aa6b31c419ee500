package chaos

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/tether-project/tether/cluster/pki"
)

// natsChildEnv names the NATS configuration file when this test binary runs
// as the deployment's NATS server (TestMain).
const natsChildEnv = "TETHER_CHAOS_NATS_CONFIG"

// serveNATS runs a NATS server from the configuration file conf until
// SIGTERM or SIGINT, and returns the process's exit code.
func serveNATS(conf string) int {
	opts, err := natsserver.ProcessConfigFile(conf)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nats:", err)
		return 1
	}
	opts.NoSigs = true
	s, err := natsserver.NewServer(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nats:", err)
		return 1
	}
	s.ConfigureLogger()
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		fmt.Fprintln(os.Stderr, "nats: not ready for connections within 30s")
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	s.Shutdown()
	s.WaitForShutdown()
	return 0
}

// The segments of a deployment in network namespaces: the edges' Raft and
// forwarding ("peers"), NATS telemetry and the edges' gossip ("nats"), the
// edges' hops and probes to the workers ("work"). The test's load and admin
// calls reach every process on the client segment, which no partition cuts.
const (
	segPeers = "peers"
	segNATS  = "nats"
	segWork  = "work"
)

// newNetnsEnv is newEnvWith's deployment with every process in a network
// namespace of its own (lab): the NATS server (this test binary, as
// deploy/nats configures it), 2 context and 2 generation workers and 3
// edges, each with its own address on each segment it is on, listening on
// the ports deploy/ ships (8000, 7400, 9000, 4222). The edges trust the
// client segment as their gateway (deploy: the gateway's network).
func newNetnsEnv(t *testing.T, lab *netlab, o envOptions) *env {
	t.Helper()
	v := &env{t: t, dir: t.TempDir()}
	v.pki = newTestPKI(t, v.dir)
	tr := v.transport(64)
	v.client = &http.Client{Transport: tr, Timeout: 20 * time.Second}
	natsM := lab.add("nats", segNATS)
	v.natsPort = 4222
	v.natsURL = fmt.Sprintf("nats://%s:4222", natsM.addr[segNATS])
	v.nkeys = workerNKeys(t, []string{"ctx-1", "ctx-2", "gen-1", "gen-2"})
	natsOptions(t, v.dir, "0.0.0.0:4222", v.nkeys)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	v.natsProc = &proc{name: "nats", bin: self, prefix: natsM.exec(), logPath: filepath.Join(v.dir, "nats.log"),
		env: []string{natsChildEnv + "=" + filepath.Join(v.dir, "nats", "nats.conf")}}
	clientNATS := net.JoinHostPort(natsM.addr[clientSegment], "4222")
	v.natsReady = func() bool {
		c, err := net.DialTimeout("tcp", clientNATS, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	// Registered before the processes start, so it runs after their stops
	// (cleanups run last-in first-out) and before the lab's teardown.
	v.stopAtEnd(tr)
	v.startNATS()
	if m := yamlGet(readDeployYAML(t, "config/edge-1.yaml"), "model"); m != "" {
		model = m
	}
	for i, fleet := range []string{"context", "context", "generation", "generation"} {
		id := fmt.Sprintf("%s-%d", map[string]string{"context": "ctx", "generation": "gen"}[fleet], i%2+1)
		m := lab.add(id, segNATS, segWork)
		files := v.pki.issue(t, id, pki.RoleWorker, m.addr[segWork], m.addr[clientSegment])
		seed := filepath.Join(v.dir, id+".nk")
		if err := os.WriteFile(seed, []byte(seedOf(t, v.nkeys[id])+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(v.dir, id+".yaml")
		writeDeployConfig(t, "config/worker-"+fleet+".yaml", path, map[string]any{
			"instance_id":         id,
			"hostname":            "0.0.0.0",
			"port":                9000,
			"advertise_url":       fmt.Sprintf("https://%s:9000", m.addr[segWork]),
			"model":               model,
			"engine":              map[string]any{"type": "sim", "time_scale": 0},
			"tls.ca_file":         files.CA,
			"tls.cert_file":       files.Cert,
			"tls.key_file":        files.Key,
			"nats.urls":           []string{v.natsURL},
			"nats.nkey_seed_file": seed,
		})
		w := &workerProc{id: id, fleet: fleet, addr: m.addr[segWork] + ":9000"}
		w.name, w.args, w.logPath, w.prefix = id, []string{"worker", "--config", path}, filepath.Join(v.dir, id+".log"), m.exec()
		w.env = secretsEnv()
		w.start(t)
		v.workers = append(v.workers, w)
	}
	var peers []any
	members := map[string]*netMember{}
	for i := range 3 {
		e := &edgeProc{id: fmt.Sprintf("edge-%d", i+1)}
		m := lab.add(e.id, segPeers, segNATS, segWork)
		members[e.id] = m
		e.httpAddr = m.addr[clientSegment] + ":8000"
		e.raftAddr = m.addr[segPeers] + ":7400"
		e.dataDir = filepath.Join(v.dir, e.id)
		peers = append(peers, map[string]any{"id": e.id, "addr": e.raftAddr})
		v.edges = append(v.edges, e)
	}
	for i, e := range v.edges {
		m := members[e.id]
		files := v.pki.issue(t, e.id, pki.RoleEdge, m.addr[clientSegment], m.addr[segPeers], m.addr[segNATS], m.addr[segWork])
		set := map[string]any{
			"hostname":               "0.0.0.0",
			"port":                   8000,
			"trusted_gateway.cidrs":  []string{lab.clientCIDR()},
			"debug_route_header":     true,
			"cluster.node_id":        e.id,
			"cluster.bind_addr":      "0.0.0.0:7400",
			"cluster.advertise_addr": e.raftAddr,
			"cluster.data_dir":       e.dataDir,
			"cluster.peers":          peers,
			"tls.ca_file":            files.CA,
			"tls.cert_file":          files.Cert,
			"tls.key_file":           files.Key,
			"nats.urls":              []string{v.natsURL},
		}
		for k, val := range o.edge {
			set[k] = val
		}
		path := filepath.Join(v.dir, e.id+".yaml")
		writeDeployConfig(t, fmt.Sprintf("config/edge-%d.yaml", i+1), path, set)
		e.name, e.args, e.logPath, e.prefix = e.id, []string{"edge", "--config", path}, filepath.Join(v.dir, e.id+".log"), m.exec()
		e.env = secretsEnv()
		e.start(t)
	}
	v.waitReady(90 * time.Second)
	return v
}
