package ops

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"gopkg.in/yaml.v3"

	"github.com/tether-project/tether/cluster"
	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/worker"
)

var deployDir = filepath.Join("..", "..", "deploy")

// setSecretEnv provides the secrets the shipped configs deliberately leave
// to the environment.
func setSecretEnv(t *testing.T) {
	t.Setenv(edge.EnvInternalRequestAuthKey, "test-internal-key-0123456789abcdef")
	t.Setenv(edge.EnvAdminToken, "test-admin-token-0123456789abcdef")
	t.Setenv(edge.EnvClusterAuthKey, "test-cluster-key-0123456789abcdef")
	// The edges' NATS password: as the operator sets it, equal to the
	// edge user's in deploy/nats/auth.conf.
	t.Setenv(edge.EnvNATSPassword, "edge-nats-password-change-me")
}

func globDeploy(t *testing.T, pattern string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployDir, pattern))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no files match deploy/%s", pattern)
	}
	return files
}

// Every shipped edge, worker and NATS configuration parses with the real
// parsers, and they agree with each other: one set of peers, each edge
// advertising its own peer address, workers and edges on the NATS cluster
// and identities the NATS servers know.
func TestDeployConfigsParse(t *testing.T) {
	setSecretEnv(t)
	var peers []cluster.Peer
	ids := map[string]bool{}
	var edgeCfgs []edge.Config
	for _, path := range globDeploy(t, "config/edge-*.yaml") {
		cfg, err := edge.LoadConfig(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		cl := cfg.Cluster
		if ids[cl.NodeID] {
			t.Errorf("%s: node_id %s used twice", path, cl.NodeID)
		}
		ids[cl.NodeID] = true
		if peers == nil {
			peers = cl.Peers
		} else if !slices.Equal(peers, cl.Peers) {
			t.Errorf("%s: peers %v differ from the other edges' %v", path, cl.Peers, peers)
		}
		self := slices.IndexFunc(cl.Peers, func(p cluster.Peer) bool { return p.ID == cl.NodeID })
		if self < 0 || cl.Peers[self].Addr != cl.AdvertiseAddr {
			t.Errorf("%s: advertise_addr %s is not this edge's peer address in %v", path, cl.AdvertiseAddr, cl.Peers)
		}
		if cfg.InternalRequestAuthKey != os.Getenv(edge.EnvInternalRequestAuthKey) || cfg.AdminToken != os.Getenv(edge.EnvAdminToken) {
			t.Errorf("%s: the secrets should come from the environment", path)
		}
		checkReadinessNeedsOneWorker(t, path, cfg)
		edgeCfgs = append(edgeCfgs, cfg)
	}
	if len(edgeCfgs) != 3 || len(peers) != 3 {
		t.Fatalf("want 3 edges with 3 peers, got %d edges, peers %v", len(edgeCfgs), peers)
	}

	fleets := map[string]worker.Config{}
	for _, path := range globDeploy(t, "config/worker-*.yaml") {
		cfg, err := worker.LoadConfig(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if cfg.Engine.Type != "proxy" || len(cfg.Engine.Upstreams) != cfg.RankCount() {
			t.Errorf("%s: want proxy mode with one upstream per rank, got %s with %d upstreams for %d ranks", path, cfg.Engine.Type, len(cfg.Engine.Upstreams), cfg.RankCount())
		}
		if cfg.IgnoreSubagentHints || cfg.InternalRequestAuthKey == "" {
			t.Errorf("%s: a current worker verifies hints (legacy_mode false, key from the environment)", path)
		}
		fleets[string(cfg.Fleet)] = cfg
	}
	if _, ok := fleets["context"]; !ok {
		t.Fatal("no context worker config")
	}
	if _, ok := fleets["generation"]; !ok {
		t.Fatal("no generation worker config")
	}

	natsHosts := map[string]bool{}
	var natsOpts []*natsserver.Options
	for _, path := range globDeploy(t, "nats/nats-*.conf") {
		o, err := natsserver.ProcessConfigFile(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(o.Routes) != 3 || o.Cluster.Name == "" {
			t.Errorf("%s: want a named cluster with 3 routes, got %q %v", path, o.Cluster.Name, o.Routes)
		}
		for _, r := range o.Routes {
			natsHosts[r.Hostname()] = true
		}
		natsOpts = append(natsOpts, o)
	}
	if len(natsOpts) != 3 {
		t.Fatalf("want 3 NATS servers, got %d", len(natsOpts))
	}
	o := natsOpts[0]
	for _, cfg := range edgeCfgs {
		checkNATSURLs(t, "edge "+cfg.Cluster.NodeID, cfg.NATS.URLs, natsHosts)
		i := slices.IndexFunc(o.Users, func(u *natsserver.User) bool { return u.Username == cfg.NATS.User })
		if i < 0 || o.Users[i].Password != cfg.NATS.Password {
			t.Errorf("edge %s: NATS user %q with its password is not in the servers' authorization", cfg.Cluster.NodeID, cfg.NATS.User)
		} else if p := o.Users[i].Permissions; p == nil || !slices.Contains(p.Subscribe.Allow, "tether.v1.>") || !slices.Contains(p.Publish.Allow, "tether.v1.kvdump.>") {
			t.Errorf("edge NATS user: permissions %+v must allow subscribing to tether.v1.> and requesting KV dumps", p)
		}
	}
	// One nkey per worker, pinned to its instance id: it publishes only
	// that instance's telemetry and receives only its dump requests.
	pinned := map[string]bool{}
	for _, u := range o.Nkeys {
		wp := u.Permissions
		if wp == nil || wp.Publish == nil || wp.Subscribe == nil {
			t.Errorf("worker nkey %s: no permissions (it could publish anything)", u.Nkey)
			continue
		}
		var id string
		for _, s := range wp.Publish.Allow {
			if x, ok := strings.CutPrefix(s, "tether.v1.kv."); ok {
				id = x
			}
		}
		want := []string{"tether.v1.load.context." + id, "tether.v1.load.generation." + id, "tether.v1.kv." + id, "tether.v1.evict." + id}
		if id == "" || strings.ContainsAny(id, "*>") || !slices.Equal(slices.Sorted(slices.Values(wp.Publish.Allow)), slices.Sorted(slices.Values(want))) {
			t.Errorf("worker nkey %s may publish %v: want exactly one instance's subjects %v", u.Nkey, wp.Publish.Allow, want)
		}
		if !slices.Equal(wp.Subscribe.Allow, []string{"tether.v1.kvdump." + id}) || wp.Response == nil {
			t.Errorf("worker nkey %s (%s): subscribe %v, responses %+v: want only its dump requests, answered as responses", u.Nkey, id, wp.Subscribe.Allow, wp.Response)
		}
		pinned[id] = true
	}
	for _, id := range []string{"ctx-1", "gen-1"} {
		if !pinned[id] {
			t.Errorf("deploy/nats/auth.conf pins no nkey to worker %s (deploy/config's instance id)", id)
		}
	}
	for f, cfg := range fleets {
		checkNATSURLs(t, f+" worker", cfg.NATS.URLs, natsHosts)
		if cfg.NATS.NKeySeedFile == "" {
			t.Errorf("%s worker: no nkey_seed_file for the worker NATS identity", f)
		}
	}
}

// checkReadinessNeedsOneWorker: with telemetry-discovered workers,
// num_instances is how many healthy workers /readyz waits for. Requiring
// more than one per fleet takes every edge out of the load balancer when a
// worker restarts (a rolling upgrade of a two-worker fleet is an outage).
func checkReadinessNeedsOneWorker(t *testing.T, where string, cfg edge.Config) {
	t.Helper()
	for name, s := range map[string]edge.ServersConfig{"context_servers": cfg.ContextServers, "generation_servers": cfg.GenerationServers} {
		if len(s.URLs) == 0 && s.NumInstances > 1 {
			t.Errorf("%s: %s.num_instances %d: a worker restart would make every edge unready", where, name, s.NumInstances)
		}
	}
}

func checkNATSURLs(t *testing.T, who string, urls []string, hosts map[string]bool) {
	t.Helper()
	if len(urls) != len(hosts) {
		t.Errorf("%s: NATS urls %v, want every server of the cluster %v", who, urls, hosts)
	}
	for _, u := range urls {
		h := strings.TrimPrefix(u, "nats://")
		h, _, _ = strings.Cut(h, ":")
		if !hosts[h] {
			t.Errorf("%s: NATS url %s is not a server of deploy/nats", who, u)
		}
	}
}

// manifest is one YAML document of deploy/kubernetes.
type manifest struct {
	file string
	doc  map[string]any
}

func (m manifest) kind() string { return str(m.doc, "kind") }
func (m manifest) name() string { return str(m.doc, "metadata", "name") }

func str(v any, path ...string) string {
	s, _ := dig(v, path...).(string)
	return s
}

func dig(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

func list(v any, path ...string) []any {
	l, _ := dig(v, path...).([]any)
	return l
}

func loadManifests(t *testing.T) []manifest {
	t.Helper()
	var out []manifest
	for _, path := range globDeploy(t, "kubernetes/*.yaml") {
		out = append(out, loadManifestFile(t, path)...)
	}
	return out
}

// loadManifestFile parses the YAML documents of one manifest file.
func loadManifestFile(t *testing.T, path string) []manifest {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []manifest
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for i := 0; ; i++ {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s document %d: %v", path, i, err)
		}
		if doc == nil {
			continue
		}
		m := manifest{file: filepath.Base(path), doc: doc}
		if str(doc, "apiVersion") == "" || m.kind() == "" {
			t.Fatalf("%s document %d: no apiVersion or kind", path, i)
		}
		if m.kind() != "Kustomization" && m.name() == "" {
			t.Fatalf("%s document %d (%s): no metadata.name", path, i, m.kind())
		}
		out = append(out, m)
	}
	return out
}

// keysOf lists a Secret's or ConfigMap's keys.
func keysOf(m manifest) map[string]string {
	out := map[string]string{}
	for _, field := range []string{"data", "stringData"} {
		if d, ok := dig(m.doc, field).(map[string]any); ok {
			for k, v := range d {
				s, _ := v.(string)
				out[k] = s
			}
		}
	}
	return out
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// Every Kubernetes manifest parses as YAML with apiVersion and kind; the
// kustomization lists every file; probes point at /readyz and /healthz on
// declared ports; every referenced Secret, ConfigMap and key exists in the
// set; the edge StatefulSet has stable peer names through a headless
// Service, persistent volumes at the configured data dir, and per-pod
// configs that parse with edge.ParseConfig and name the right pods; the
// worker Deployments run beside an engine in proxy mode with configs that
// parse with worker.ParseConfig.
func TestKubernetesManifests(t *testing.T) {
	setSecretEnv(t)
	ms := loadManifests(t)
	byKind := map[string]map[string]manifest{}
	var files []string
	for _, m := range ms {
		if byKind[m.kind()] == nil {
			byKind[m.kind()] = map[string]manifest{}
		}
		byKind[m.kind()][m.name()] = m
		if !slices.Contains(files, m.file) && m.kind() != "Kustomization" {
			files = append(files, m.file)
		}
	}
	var kust []string
	for _, r := range list(byKind["Kustomization"][""].doc, "resources") {
		kust = append(kust, r.(string))
	}
	sort.Strings(files)
	sort.Strings(kust)
	if !slices.Equal(files, kust) {
		t.Errorf("kustomization resources %v, manifest files %v", kust, files)
	}
	secrets, configMaps := byKind["Secret"], byKind["ConfigMap"]

	var podLabels []map[string]any
	workloads := 0
	for _, kind := range []string{"StatefulSet", "Deployment"} {
		for name, m := range byKind[kind] {
			workloads++
			where := kind + "/" + name
			tmpl := dig(m.doc, "spec", "template")
			labels, _ := dig(tmpl, "metadata", "labels").(map[string]any)
			podLabels = append(podLabels, labels)
			if sel, _ := dig(m.doc, "spec", "selector", "matchLabels").(map[string]any); !subset(sel, labels) {
				t.Errorf("%s: selector %v does not match the pod labels %v", where, sel, labels)
			}
			volumes := map[string]any{}
			for _, v := range list(tmpl, "spec", "volumes") {
				volumes[str(v, "name")] = v
				if s := str(v, "secret", "secretName"); s != "" && secrets[s].doc == nil {
					t.Errorf("%s: volume %s uses Secret %s, not in the set", where, str(v, "name"), s)
				}
				if c := str(v, "configMap", "name"); c != "" && configMaps[c].doc == nil {
					t.Errorf("%s: volume %s uses ConfigMap %s, not in the set", where, str(v, "name"), c)
				}
			}
			for _, pvc := range list(m.doc, "spec", "volumeClaimTemplates") {
				volumes[str(pvc, "metadata", "name")] = pvc
			}
			tetherContainers := 0
			for _, c := range list(tmpl, "spec", "containers") {
				cname := str(c, "name")
				env := map[string]bool{}
				for _, e := range list(c, "env") {
					env[str(e, "name")] = true
					if ref := dig(e, "valueFrom", "secretKeyRef"); ref != nil {
						if _, ok := keysOf(secrets[str(ref, "name")])[str(ref, "key")]; !ok {
							t.Errorf("%s/%s: env %s needs Secret %s key %s, not in the set", where, cname, str(e, "name"), str(ref, "name"), str(ref, "key"))
						}
					}
					if ref := dig(e, "valueFrom", "configMapKeyRef"); ref != nil {
						if _, ok := keysOf(configMaps[str(ref, "name")])[str(ref, "key")]; !ok {
							t.Errorf("%s/%s: env %s needs ConfigMap %s key %s, not in the set", where, cname, str(e, "name"), str(ref, "name"), str(ref, "key"))
						}
					}
				}
				var args []string
				for _, a := range append(list(c, "command"), list(c, "args")...) {
					args = append(args, a.(string))
					for _, ref := range varRef.FindAllStringSubmatch(a.(string), -1) {
						if !env[ref[1]] {
							t.Errorf("%s/%s: argument %q refers to $(%s), which the container does not define", where, cname, a, ref[1])
						}
					}
				}
				ports := map[string]bool{}
				for _, p := range list(c, "ports") {
					ports[str(p, "name")] = true
				}
				for _, probe := range []string{"readinessProbe", "livenessProbe", "startupProbe"} {
					if port, _ := dig(c, probe, "httpGet", "port").(string); port != "" && !ports[port] {
						t.Errorf("%s/%s: %s probes port %q, not a declared container port", where, cname, probe, port)
					}
				}
				for _, vm := range list(c, "volumeMounts") {
					if _, ok := volumes[str(vm, "name")]; !ok {
						t.Errorf("%s/%s: mounts volume %s, not declared", where, cname, str(vm, "name"))
					}
				}
				if !strings.Contains(str(c, "image"), "tether") {
					continue
				}
				tetherContainers++
				if p := str(c, "readinessProbe", "httpGet", "path"); p != "/readyz" {
					t.Errorf("%s/%s: readiness probe on %q, want /readyz", where, cname, p)
				}
				if p := str(c, "livenessProbe", "httpGet", "path"); p != "/healthz" {
					t.Errorf("%s/%s: liveness probe on %q, want /healthz", where, cname, p)
				}
				switch {
				case len(args) > 0 && args[0] == "worker":
					checkWorkerSet(t, m, c, args, tmpl, configMaps)
				case kind != "StatefulSet":
					t.Errorf("%s: an edge runs in a StatefulSet (its node id is its pod name)", where)
				case slices.Contains(args, "--node-id"):
					checkNonvoterStatefulSet(t, m, c, args, byKind)
				default:
					checkEdgeStatefulSet(t, m, c, args, byKind)
				}
			}
			if tetherContainers != 1 {
				t.Errorf("%s: %d tether containers, want 1", where, tetherContainers)
			}
		}
	}
	if workloads != 4 {
		t.Errorf("%d workloads, want the voting and non-voting edge StatefulSets and two worker StatefulSets", workloads)
	}
	for _, kind := range []string{"Service", "PodDisruptionBudget", "NetworkPolicy"} {
		for name, m := range byKind[kind] {
			sel, _ := dig(m.doc, "spec", "selector").(map[string]any)
			if kind != "Service" {
				sel, _ = dig(m.doc, "spec", "selector", "matchLabels").(map[string]any)
			}
			if kind == "NetworkPolicy" {
				sel, _ = dig(m.doc, "spec", "podSelector", "matchLabels").(map[string]any)
			}
			if !slices.ContainsFunc(podLabels, func(l map[string]any) bool { return subset(sel, l) }) {
				t.Errorf("%s/%s: selector %v matches no pod", kind, name, sel)
			}
		}
	}
}

func subset(sel, labels map[string]any) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func checkEdgeStatefulSet(t *testing.T, sts manifest, c any, args []string, byKind map[string]map[string]manifest) {
	t.Helper()
	name, ns := sts.name(), str(sts.doc, "metadata", "namespace")
	if p := str(sts.doc, "spec", "podManagementPolicy"); p != "Parallel" {
		t.Errorf("StatefulSet %s: podManagementPolicy %q; bootstrapping voters must start together (Parallel)", name, p)
	}
	svcName := str(sts.doc, "spec", "serviceName")
	svc := byKind["Service"][svcName]
	if svc.doc == nil || str(svc.doc, "spec", "clusterIP") != "None" || dig(svc.doc, "spec", "publishNotReadyAddresses") != true {
		t.Fatalf("StatefulSet %s: serviceName %q must be a headless Service publishing not-ready addresses (peers resolve each other before a leader exists)", name, svcName)
	}
	raftPort := 0
	for _, p := range list(svc.doc, "spec", "ports") {
		if str(p, "name") == "raft" {
			raftPort, _ = dig(p, "port").(int)
		}
	}
	dataMount := ""
	for _, vm := range list(c, "volumeMounts") {
		if str(vm, "name") == "data" {
			dataMount = str(vm, "mountPath")
		}
	}
	if dataMount == "" || len(list(sts.doc, "spec", "volumeClaimTemplates")) == 0 {
		t.Fatalf("StatefulSet %s: no persistent data volume (volumeClaimTemplates) mounted", name)
	}
	// The pod reads /etc/tether/$(POD_NAME).yaml from the config volume.
	cfgArg := args[slices.Index(args, "--config")+1]
	if cfgArg != "/etc/tether/$(POD_NAME).yaml" {
		t.Fatalf("StatefulSet %s: --config %q, want the per-pod /etc/tether/$(POD_NAME).yaml", name, cfgArg)
	}
	// The per-pod configs: a ConfigMap (they hold no secret; those come
	// from the environment) or a Secret.
	var cfgSecret manifest
	for _, v := range list(sts.doc, "spec", "template", "spec", "volumes") {
		if str(v, "name") == "config" {
			if cm := str(v, "configMap", "name"); cm != "" {
				cfgSecret = byKind["ConfigMap"][cm]
			} else {
				cfgSecret = byKind["Secret"][str(v, "secret", "secretName")]
			}
		}
	}
	keys := keysOf(cfgSecret)
	replicas, _ := dig(sts.doc, "spec", "replicas").(int)
	if replicas != 3 {
		t.Errorf("StatefulSet %s: %d replicas, want 3 voters", name, replicas)
	}
	var peers []cluster.Peer
	for i := range replicas {
		pod := fmt.Sprintf("%s-%d", name, i)
		data, ok := keys[pod+".yaml"]
		if !ok {
			t.Errorf("StatefulSet %s: Secret %s has no %s.yaml for pod %s", name, cfgSecret.name(), pod, pod)
			continue
		}
		cfg, err := edge.ParseConfig([]byte(data))
		if err != nil {
			t.Errorf("%s.yaml: %v", pod, err)
			continue
		}
		checkReadinessNeedsOneWorker(t, pod+".yaml", cfg)
		cl := cfg.Cluster
		wantAddr := fmt.Sprintf("%s.%s.%s.svc.cluster.local:%d", pod, svcName, ns, raftPort)
		if cl.NodeID != pod || cl.AdvertiseAddr != wantAddr || cl.DataDir != dataMount || !cl.Bootstrap {
			t.Errorf("%s.yaml: node_id %q advertise_addr %q data_dir %q bootstrap %v; want %q, %q, %q, true",
				pod, cl.NodeID, cl.AdvertiseAddr, cl.DataDir, cl.Bootstrap, pod, wantAddr, dataMount)
		}
		if _, port, _ := strings.Cut(cl.BindAddr, ":"); port != strconv.Itoa(raftPort) {
			t.Errorf("%s.yaml: bind_addr %s, want the raft port %d", pod, cl.BindAddr, raftPort)
		}
		if peers == nil {
			peers = cl.Peers
		} else if !slices.Equal(peers, cl.Peers) {
			t.Errorf("%s.yaml: peers differ from the other pods'", pod)
		}
		if cfg.Port != portOf(c, "http") {
			t.Errorf("%s.yaml: port %d, the container's http port is %d", pod, cfg.Port, portOf(c, "http"))
		}
	}
	if len(peers) != replicas {
		t.Errorf("StatefulSet %s: peers %v, want every pod", name, peers)
	}
}

// checkNonvoterStatefulSet: the non-voting edges share one config that
// parses, asks for suffrage nonvoter and joins through every voter; each
// pod's node id is its name and it advertises its DNS name through the
// set's headless Service; an HPA scales the set; the pods never share the
// voters' selector (the voters' PDB and Raft Service count only voters).
func checkNonvoterStatefulSet(t *testing.T, sts manifest, c any, args []string, byKind map[string]map[string]manifest) {
	t.Helper()
	name, ns := sts.name(), str(sts.doc, "metadata", "namespace")
	flag := func(f string) string {
		i := slices.Index(args, f)
		if i < 0 || i+1 >= len(args) {
			t.Fatalf("StatefulSet %s: no %s argument in %v", name, f, args)
		}
		return args[i+1]
	}
	svcName := str(sts.doc, "spec", "serviceName")
	svc := byKind["Service"][svcName]
	if svc.doc == nil || str(svc.doc, "spec", "clusterIP") != "None" {
		t.Fatalf("StatefulSet %s: serviceName %q must be a headless Service (the pods' DNS names)", name, svcName)
	}
	if id := flag("--node-id"); id != "$(POD_NAME)" {
		t.Errorf("StatefulSet %s: --node-id %q, want $(POD_NAME)", name, id)
	}
	wantAdv := fmt.Sprintf("$(POD_NAME).%s.%s.svc.cluster.local:%d", svcName, ns, portOf(c, "raft"))
	if adv := flag("--advertise-addr"); adv != wantAdv {
		t.Errorf("StatefulSet %s: --advertise-addr %q, want %q", name, adv, wantAdv)
	}
	cfgPath := flag("--config")
	var cm manifest
	for _, v := range list(sts.doc, "spec", "template", "spec", "volumes") {
		if str(v, "name") == "config" {
			cm = byKind["ConfigMap"][str(v, "configMap", "name")]
		}
	}
	data, ok := keysOf(cm)[filepath.Base(cfgPath)]
	if !ok {
		t.Fatalf("StatefulSet %s: --config %s is not a key of its config volume", name, cfgPath)
	}
	// As the pod runs it: the file, then the flags, then the validation.
	cfg, err := edge.DecodeConfig([]byte(data))
	if err != nil {
		t.Fatalf("StatefulSet %s: %s: %v", name, cfgPath, err)
	}
	pod := name + "-0"
	cfg.Cluster.NodeID = strings.ReplaceAll(flag("--node-id"), "$(POD_NAME)", pod)
	cfg.Cluster.AdvertiseAddr = strings.ReplaceAll(flag("--advertise-addr"), "$(POD_NAME)", pod)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("StatefulSet %s: %s with its flags: %v", name, cfgPath, err)
	}
	checkReadinessNeedsOneWorker(t, cfgPath, cfg)
	cl := cfg.Cluster
	if cl.Suffrage != "nonvoter" || cl.Bootstrap || len(cl.Join) != 3 {
		t.Errorf("%s: suffrage %q bootstrap %v join %v; want nonvoter, false, the three voters", cfgPath, cl.Suffrage, cl.Bootstrap, cl.Join)
	}
	voters := byKind["StatefulSet"]["tether-edge"]
	vsel, _ := dig(voters.doc, "spec", "selector", "matchLabels").(map[string]any)
	labels, _ := dig(sts.doc, "spec", "template", "metadata", "labels").(map[string]any)
	if subset(vsel, labels) {
		t.Errorf("StatefulSet %s: its pods match the voters' selector %v", name, vsel)
	}
	for _, j := range cl.Join {
		if !strings.Contains(j, ".tether-edge-raft.") {
			t.Errorf("%s: join address %s is not a voter's stable name", cfgPath, j)
		}
	}
	found := false
	for _, h := range byKind["HorizontalPodAutoscaler"] {
		if str(h.doc, "spec", "scaleTargetRef", "kind") == "StatefulSet" && str(h.doc, "spec", "scaleTargetRef", "name") == name {
			found = true
		}
	}
	if !found {
		t.Errorf("StatefulSet %s: no HorizontalPodAutoscaler scales it", name)
	}
}

func portOf(c any, name string) int {
	for _, p := range list(c, "ports") {
		if str(p, "name") == name {
			n, _ := dig(p, "containerPort").(int)
			return n
		}
	}
	return 0
}

func checkWorkerSet(t *testing.T, d manifest, c any, args []string, tmpl any, configMaps map[string]manifest) {
	t.Helper()
	name := d.kind() + " " + d.name()
	cfgPath := args[slices.Index(args, "--config")+1]
	mounts := map[string]string{} // mount path → volume name
	for _, vm := range list(c, "volumeMounts") {
		mounts[str(vm, "mountPath")] = str(vm, "name")
	}
	vols := map[string]any{}
	for _, v := range list(tmpl, "spec", "volumes") {
		vols[str(v, "name")] = v
	}
	cm := configMaps[str(vols[mounts[filepath.Dir(cfgPath)]], "configMap", "name")]
	data, ok := keysOf(cm)[filepath.Base(cfgPath)]
	if !ok {
		t.Fatalf("%s: --config %s is not a key of a mounted ConfigMap", name, cfgPath)
	}
	cfg, err := worker.ParseConfig([]byte(data))
	if err != nil {
		t.Fatalf("%s: %s: %v", name, cfgPath, err)
	}
	if want := strings.TrimSuffix(filepath.Base(cfgPath), ".yaml"); string(cfg.Fleet) != want {
		t.Errorf("%s: %s configures fleet %s", name, cfgPath, cfg.Fleet)
	}
	if !slices.Contains(args, "--instance-id") || !slices.Contains(args, "--hostname") {
		t.Errorf("%s: args %v must set --instance-id (the pod name) and --hostname (the pod IP the worker listens on)", name, args)
	}
	if cfg.Port != portOf(c, "http") {
		t.Errorf("%s: worker port %d, container http port %d", name, cfg.Port, portOf(c, "http"))
	}
	// Proxy mode: the engine container listens where the upstreams point.
	if cfg.Engine.Type != "proxy" {
		t.Fatalf("%s: engine type %s, want proxy", name, cfg.Engine.Type)
	}
	enginePorts := map[string]bool{}
	for _, ec := range list(tmpl, "spec", "containers") {
		if !strings.Contains(str(ec, "image"), "tether") {
			for _, p := range list(ec, "ports") {
				n, _ := dig(p, "containerPort").(int)
				enginePorts[strconv.Itoa(n)] = true
			}
		}
	}
	for _, u := range cfg.Engine.Upstreams {
		port := u[strings.LastIndex(u, ":")+1:]
		if !strings.HasPrefix(u, "http://127.0.0.1:") || !enginePorts[port] {
			t.Errorf("%s: upstream %s is not an engine container beside the worker (ports %v)", name, u, enginePorts)
		}
	}
}
