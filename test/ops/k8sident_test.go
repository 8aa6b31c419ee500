package ops

import (
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tether-project/tether/cluster/pki"
	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/edge/natsembed"
	"github.com/tether-project/tether/internal/telemetry"
	"github.com/tether-project/tether/test/natstest"
	"github.com/tether-project/tether/test/workertest"
	"github.com/tether-project/tether/worker"
)

// Per-pod identities on Kubernetes: every worker pod's certificate names
// its instance (spiffe://tether/worker/<pod name>), the edges check it
// (no tls.worker_server_name), and the NATS servers map each pod's
// certificate to a user pinned to that pod's subjects
// (deploy/nats/kubernetes-auth.conf, generated here from the manifests and
// edge/natsembed's permissions).

var updateNATSAuth = flag.Bool("update", false, "rewrite deploy/nats/kubernetes-auth.conf from deploy/kubernetes and edge/natsembed")

// natsIdentitiesAnnotation is how many ordinals of a StatefulSet the NATS
// authorization lists.
const natsIdentitiesAnnotation = "tether.dev/nats-identities"

// k8sNATSAuthFile is the generated authorization of the NATS servers
// serving deploy/kubernetes; k8sNATSTLSFile their client TLS.
var (
	k8sNATSAuthFile = filepath.Join(deployDir, "nats", "kubernetes-auth.conf")
	k8sNATSTLSFile  = filepath.Join(deployDir, "nats", "kubernetes-tls.conf")
)

// tetherContainer is the pod template's container running the tether
// image, with its arguments (nil when there is none).
func tetherContainer(m manifest) (any, []string) {
	for _, c := range list(m.doc, "spec", "template", "spec", "containers") {
		if !strings.Contains(str(c, "image"), "tether") {
			continue
		}
		var args []string
		for _, a := range append(list(c, "command"), list(c, "args")...) {
			s, _ := a.(string)
			args = append(args, s)
		}
		return c, args
	}
	return nil, nil
}

func flagValue(args []string, name string) string {
	i := slices.Index(args, name)
	if i < 0 || i+1 >= len(args) {
		return ""
	}
	return args[i+1]
}

// csiAttributes are the cert-manager csi-driver attributes of the pod
// volume mounted at dir (nil when that volume is not a csi-driver one).
func csiAttributes(m manifest, c any, dir string) map[string]any {
	vol := ""
	for _, vm := range list(c, "volumeMounts") {
		if str(vm, "mountPath") == dir {
			vol = str(vm, "name")
		}
	}
	for _, v := range list(m.doc, "spec", "template", "spec", "volumes") {
		if str(v, "name") == vol && str(v, "csi", "driver") == "csi.cert-manager.io" {
			attrs, _ := dig(v, "csi", "volumeAttributes").(map[string]any)
			return attrs
		}
	}
	return nil
}

// workerConfigOf is the worker configuration the pod reads (--config, a
// key of a mounted ConfigMap), with the pod's flags applied as `tether
// worker` applies them, for pod.
func workerConfigOf(t *testing.T, m manifest, c any, args []string, byKind map[string]map[string]manifest, pod string) worker.Config {
	t.Helper()
	cfgPath := flagValue(args, "--config")
	vol := ""
	for _, vm := range list(c, "volumeMounts") {
		if str(vm, "mountPath") == filepath.Dir(cfgPath) {
			vol = str(vm, "name")
		}
	}
	var data string
	for _, v := range list(m.doc, "spec", "template", "spec", "volumes") {
		if str(v, "name") == vol {
			data = keysOf(byKind["ConfigMap"][str(v, "configMap", "name")])[filepath.Base(cfgPath)]
		}
	}
	if data == "" {
		t.Fatalf("%s: --config %s is not a key of a mounted ConfigMap", m.name(), cfgPath)
	}
	cfg, err := worker.ParseConfig([]byte(data))
	if err != nil {
		t.Fatalf("%s: %s: %v", m.name(), cfgPath, err)
	}
	sub := strings.NewReplacer("$(POD_NAME)", pod, "$(POD_IP)", "10.0.0.7")
	cfg.InstanceID = sub.Replace(flagValue(args, "--instance-id"))
	cfg.Hostname = sub.Replace(flagValue(args, "--hostname"))
	cfg.AdvertiseURL = sub.Replace(flagValue(args, "--advertise-url"))
	if err := cfg.Validate(); err != nil {
		t.Fatalf("%s: %s with its flags for pod %s: %v", m.name(), cfgPath, pod, err)
	}
	return cfg
}

// Every worker pod has its own certificate naming its instance: the worker
// sets are StatefulSets with a headless Service (stable pod names and DNS
// names known before the pod starts); each pod's tls volume is a
// csi-driver certificate whose only URI SAN is
// spiffe://tether/worker/${POD_NAME}, the instance id the worker reports
// (--instance-id $(POD_NAME)), and whose DNS names cover the URL it
// advertises; its NATS identity is that certificate; the pods mount no
// service account token. No edge configuration
// sets tls.worker_server_name (which would accept one shared certificate
// for every instance), and no Secret holds a worker certificate or nkey.
func TestKubernetesPerPodWorkerIdentity(t *testing.T) {
	setSecretEnv(t)
	byKind := map[string]map[string]manifest{}
	var workers []manifest
	for _, m := range loadManifests(t) {
		if byKind[m.kind()] == nil {
			byKind[m.kind()] = map[string]manifest{}
		}
		byKind[m.kind()][m.name()] = m
		if _, args := tetherContainer(m); len(args) > 0 && args[0] == "worker" {
			workers = append(workers, m)
		}
	}
	if len(workers) != 2 {
		t.Fatalf("%d workloads run tether worker, want the context and generation sets", len(workers))
	}
	for _, m := range workers {
		checkWorkerPodIdentity(t, m, byKind)
	}
	for _, cm := range byKind["ConfigMap"] {
		if cm.name() != "tether-edge-config" {
			continue
		}
		for key, data := range keysOf(cm) {
			cfg, err := edge.DecodeConfig([]byte(data))
			if err != nil {
				t.Fatalf("%s %s: %v", cm.name(), key, err)
			}
			if cfg.TLS.WorkerServerName != "" {
				t.Errorf("%s %s: tls.worker_server_name %q: the edge would accept one shared certificate for every worker instead of checking spiffe://tether/worker/<instance>", cm.name(), key, cfg.TLS.WorkerServerName)
			}
			n := cfg.NATS
			if n.TLS.CertFile != cfg.TLS.CertFile || n.TLS.KeyFile != cfg.TLS.KeyFile || n.User != "" || n.NKeySeedFile != "" || n.Token != "" || n.CredsFile != "" {
				t.Errorf("%s %s: the edge's NATS identity must be its own certificate (nats.tls %+v, user %q, nkey %q)", cm.name(), key, n.TLS, n.User, n.NKeySeedFile)
			}
		}
	}
	for _, c := range byKind["Certificate"] {
		for _, u := range list(c.doc, "spec", "uris") {
			if s, _ := u.(string); strings.HasPrefix(s, pki.IdentityURI(pki.RoleWorker, "")) {
				t.Errorf("Certificate %s names %s: a Secret-held worker certificate can be mounted by any pod; issue worker certificates per pod (csi-driver)", c.name(), s)
			}
		}
	}
}

func checkWorkerPodIdentity(t *testing.T, m manifest, byKind map[string]map[string]manifest) {
	t.Helper()
	where := m.kind() + " " + m.name()
	if m.kind() != "StatefulSet" {
		t.Errorf("%s: a worker's instance id is its pod name, which must be stable and known before the pod starts (a StatefulSet) for its certificate to name it", where)
		return
	}
	svcName, ns := str(m.doc, "spec", "serviceName"), str(m.doc, "metadata", "namespace")
	svc := byKind["Service"][svcName]
	labels, _ := dig(m.doc, "spec", "template", "metadata", "labels").(map[string]any)
	if sel, _ := dig(svc.doc, "spec", "selector").(map[string]any); svc.doc == nil || str(svc.doc, "spec", "clusterIP") != "None" ||
		dig(svc.doc, "spec", "publishNotReadyAddresses") != true || !subset(sel, labels) {
		t.Errorf("%s: serviceName %q must be a headless Service of its pods publishing not-ready addresses (edges dial a worker once it reports)", where, svcName)
	}
	if dig(m.doc, "spec", "template", "spec", "automountServiceAccountToken") != false {
		t.Errorf("%s: the pods mount a service account token; a worker needs no Kubernetes API access (automountServiceAccountToken: false)", where)
	}
	c, args := tetherContainer(m)
	if id := flagValue(args, "--instance-id"); id != "$(POD_NAME)" {
		t.Errorf("%s: --instance-id %q, want $(POD_NAME)", where, id)
	}
	pod := m.name() + "-0"
	cfg := workerConfigOf(t, m, c, args, byKind, pod)
	podDNS := fmt.Sprintf("%s.%s.%s.svc.cluster.local", pod, svcName, ns)
	if want := fmt.Sprintf("https://%s:%d", podDNS, cfg.Port); cfg.AdvertiseURL != want {
		t.Errorf("%s: pod %s advertises %q, want its DNS name %s (edges verify the certificate against it; csi-driver cannot name the pod IP)", where, pod, cfg.AdvertiseURL, want)
	}
	tlsDir := filepath.Dir(cfg.TLS.CertFile)
	attrs := csiAttributes(m, c, tlsDir)
	if attrs == nil {
		t.Fatalf("%s: the certificate directory %s is not a cert-manager csi-driver volume: the pods would share one certificate", where, tlsDir)
	}
	sub := strings.NewReplacer("${POD_NAME}", pod, "${POD_NAMESPACE}", ns)
	attr := func(k string) string { s, _ := attrs["csi.cert-manager.io/"+k].(string); return sub.Replace(s) }
	if got, want := attr("uri-sans"), pki.IdentityURI(pki.RoleWorker, cfg.InstanceID); got != want {
		t.Errorf("%s: pod %s's certificate names URI SANs %q, want exactly %s (the instance it reports as)", where, pod, got, want)
	}
	if !slices.Contains(strings.Split(attr("dns-names"), ","), podDNS) {
		t.Errorf("%s: pod %s's certificate DNS names %q do not cover its advertised host %s", where, pod, attr("dns-names"), podDNS)
	}
	if u := attr("key-usages"); !strings.Contains(u, "server auth") || !strings.Contains(u, "client auth") {
		t.Errorf("%s: key usages %q: the certificate serves the edges (server auth) and authenticates to NATS (client auth)", where, u)
	}
	for file, key := range map[string]string{cfg.TLS.CertFile: "certificate-file", cfg.TLS.KeyFile: "privatekey-file", cfg.TLS.CAFile: "ca-file"} {
		if filepath.Dir(file) != tlsDir || filepath.Base(file) != attr(key) {
			t.Errorf("%s: %s is not the csi volume's %s %q", where, file, key, attr(key))
		}
	}
	n := cfg.NATS
	if n.TLS.CertFile != cfg.TLS.CertFile || n.TLS.KeyFile != cfg.TLS.KeyFile || n.NKeySeedFile != "" || n.User != "" || n.Token != "" || n.CredsFile != "" {
		t.Errorf("%s: the worker's NATS identity must be its pod certificate (nats.tls %+v; nkey %q, user %q)", where, n.TLS, n.NKeySeedFile, n.User)
	}
	for _, u := range n.URLs {
		if !strings.HasPrefix(u, "tls://") {
			t.Errorf("%s: NATS url %s: the certificate identity needs TLS (tls://)", where, u)
		}
	}
}

// identitySet is one StatefulSet's pods as NATS users.
type identitySet struct {
	set   string
	role  pki.Role
	count int
}

func (s identitySet) ids() []string {
	out := make([]string, s.count)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", s.set, i)
	}
	return out
}

// natsIdentitySets reads the StatefulSets running tether and how many
// ordinals each lists, checking the count covers every replica count the
// set may reach (its replicas, an autoscaler's maximum).
func natsIdentitySets(t *testing.T) []identitySet {
	t.Helper()
	maxReplicas := map[string]int{}
	raise := func(name string, n int) { maxReplicas[name] = max(maxReplicas[name], n) }
	ms := loadManifests(t)
	for _, path := range globDeploy(t, "kubernetes/autoscaling/*.yaml") {
		ms = append(ms, loadManifestFile(t, path)...)
	}
	for _, m := range ms {
		target := str(m.doc, "spec", "scaleTargetRef", "name")
		switch m.kind() {
		case "HorizontalPodAutoscaler":
			n, _ := dig(m.doc, "spec", "maxReplicas").(int)
			raise(target, n)
		case "ScaledObject":
			n, _ := dig(m.doc, "spec", "maxReplicaCount").(int)
			raise(target, n)
		}
	}
	var sets []identitySet
	for _, m := range ms {
		_, args := tetherContainer(m)
		if len(args) == 0 || m.kind() != "StatefulSet" {
			continue
		}
		role := pki.RoleEdge
		if args[0] == "worker" {
			role = pki.RoleWorker
		}
		replicas, _ := dig(m.doc, "spec", "replicas").(int)
		raise(m.name(), replicas)
		n, err := strconv.Atoi(str(m.doc, "metadata", "annotations", natsIdentitiesAnnotation))
		if err != nil || n < maxReplicas[m.name()] {
			t.Errorf("StatefulSet %s: annotation %s %q: want a count of at least %d (its replicas and any autoscaler's maximum): pods beyond it cannot reach NATS",
				m.name(), natsIdentitiesAnnotation, str(m.doc, "metadata", "annotations", natsIdentitiesAnnotation), maxReplicas[m.name()])
		}
		checkPodsPresentTheirIdentity(t, m, role, replicas, ms)
		sets = append(sets, identitySet{set: m.name(), role: role, count: max(n, 0)})
	}
	slices.SortFunc(sets, func(a, b identitySet) int { return strings.Compare(a.set, b.set) })
	return sets
}

// renderNATSAuthorization is deploy/nats/kubernetes-auth.conf: one user per
// pod, named by its certificate's identity, with natsembed's permissions
// for its role (the embedded server's, so both servers pin the same
// subjects).
func renderNATSAuthorization(sets []identitySet) string {
	var b strings.Builder
	b.WriteString(`# The NATS users of deploy/kubernetes, for servers running
# kubernetes-tls.conf (verify_and_map): one per pod, named by the URI SAN
# of the pod's certificate, with the permissions of its role — an edge reads
# all telemetry; worker X publishes only X's load reports, KV events and
# evictions, receives only X's dump requests and replies only to requests
# it received (docs/security.md). The subjects are edge/natsembed's, the
# embedded server's, from internal/telemetry.
#
# GENERATED from the StatefulSets' tether.dev/nats-identities annotations
# (how many ordinals of each set are listed); do not edit. After changing an
# annotation, regenerate with
#   go test ./test/ops -run TestKubernetesNATSAuthorization -update
# and reload the NATS servers (nats-server --signal reload).
authorization {
  users = [
`)
	quote := func(ss []string) string {
		q := make([]string, len(ss))
		for i, s := range ss {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	for _, s := range sets {
		fmt.Fprintf(&b, "    # StatefulSet %s: %d pods\n", s.set, s.count)
		for _, id := range s.ids() {
			p := natsembed.EdgePermissions()
			if s.role == pki.RoleWorker {
				p = natsembed.WorkerPermissions(id)
			}
			fmt.Fprintf(&b, "    {\n      user: %s\n      permissions: {\n", strconv.Quote(pki.IdentityURI(s.role, id)))
			fmt.Fprintf(&b, "        publish: { allow: %s }\n", quote(p.Publish.Allow))
			fmt.Fprintf(&b, "        subscribe: { allow: %s }\n", quote(p.Subscribe.Allow))
			if p.Response != nil {
				fmt.Fprintf(&b, "        allow_responses: { max: %d, expires: %q }\n", p.Response.MaxMsgs, p.Response.Expires.String())
			}
			b.WriteString("      }\n    }\n")
		}
	}
	b.WriteString("  ]\n}\n")
	return b.String()
}

// The NATS authorization for Kubernetes is what the manifests and
// natsembed say: generated (rewrite it with -update), parsed by the real
// nats-server, it holds exactly one user per listed pod — the pod's
// certificate identity — with no password or nkey; each worker user may
// publish exactly its own instance's load, KV and eviction subjects and
// subscribe only its dump subject (internal/telemetry's subject functions,
// the same permissions as natsembed.WorkerPermissions), each edge user has
// natsembed.EdgePermissions; and kubernetes-tls.conf maps certificates to
// users (verify_and_map).
func TestKubernetesNATSAuthorization(t *testing.T) {
	sets := natsIdentitySets(t)
	want := renderNATSAuthorization(sets)
	if *updateNATSAuth {
		if err := os.WriteFile(k8sNATSAuthFile, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(k8sNATSAuthFile)
	if err != nil {
		t.Fatalf("%v (generate it: go test ./test/ops -run TestKubernetesNATSAuthorization -update)", err)
	}
	if string(got) != want {
		t.Errorf("%s is not what the manifests and edge/natsembed's permissions give: regenerate it (go test ./test/ops -run TestKubernetesNATSAuthorization -update)", k8sNATSAuthFile)
	}

	o, err := natsserver.ProcessConfigFile(k8sNATSAuthFile)
	if err != nil {
		t.Fatalf("%s: %v", k8sNATSAuthFile, err)
	}
	if len(o.Nkeys) != 0 {
		t.Errorf("%s: %d nkey users: every identity is a certificate", k8sNATSAuthFile, len(o.Nkeys))
	}
	users := map[string]*natsserver.User{}
	for _, u := range o.Users {
		users[u.Username] = u
		if u.Password != "" {
			t.Errorf("user %s has a password: identities are certificates", u.Username)
		}
	}
	listed := 0
	for _, s := range sets {
		if s.count == 0 {
			t.Errorf("StatefulSet %s: no pod listed", s.set)
		}
		for _, id := range s.ids() {
			listed++
			name := pki.IdentityURI(s.role, id)
			u := users[name]
			if u == nil {
				t.Errorf("%s: no user %s (pod %s of %s)", k8sNATSAuthFile, name, id, s.set)
				continue
			}
			if s.role == pki.RoleWorker {
				checkWorkerNATSUser(t, id, u.Permissions)
			} else if !reflect.DeepEqual(u.Permissions, natsembed.EdgePermissions()) {
				t.Errorf("user %s: permissions %s, want natsembed.EdgePermissions %s", name, permString(u.Permissions), permString(natsembed.EdgePermissions()))
			}
		}
	}
	if len(users) != listed {
		t.Errorf("%s: %d users, want the %d listed pods", k8sNATSAuthFile, len(users), listed)
	}

	dir := t.TempDir()
	tlsConf, _ := writeNATSTLSConf(t, dir)
	to, err := natsserver.ProcessConfigFile(tlsConf)
	if err != nil {
		t.Fatalf("%s: %v", k8sNATSTLSFile, err)
	}
	if !to.TLSMap || to.TLSConfig == nil || to.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Errorf("%s: verify_and_map %v: clients must be identified by their verified certificates", k8sNATSTLSFile, to.TLSMap)
	}
}

// checkWorkerNATSUser: worker id's user may publish exactly id's load
// reports (both fleets), KV events and evictions, subscribe only to id's
// dump requests, and reply only to requests it received.
func checkWorkerNATSUser(t *testing.T, id string, p *natsserver.Permissions) {
	t.Helper()
	if p == nil || p.Publish == nil || p.Subscribe == nil || p.Response == nil {
		t.Errorf("worker %s: permissions %s: want publish, subscribe and response permissions", id, permString(p))
		return
	}
	pub := []string{telemetry.LoadSubject(telemetry.FleetContext, id), telemetry.LoadSubject(telemetry.FleetGeneration, id), telemetry.KVSubject(id), telemetry.EvictSubject(id)}
	if !slices.Equal(slices.Sorted(slices.Values(p.Publish.Allow)), slices.Sorted(slices.Values(pub))) || len(p.Publish.Deny) != 0 {
		t.Errorf("worker %s may publish %v: want exactly its own subjects %v", id, p.Publish.Allow, pub)
	}
	if !slices.Equal(p.Subscribe.Allow, []string{telemetry.KVDumpSubject(id)}) {
		t.Errorf("worker %s may subscribe to %v: want only %s", id, p.Subscribe.Allow, telemetry.KVDumpSubject(id))
	}
	if !reflect.DeepEqual(p, natsembed.WorkerPermissions(id)) {
		t.Errorf("worker %s: permissions %s differ from the embedded server's (natsembed.WorkerPermissions) %s", id, permString(p), permString(natsembed.WorkerPermissions(id)))
	}
}

// writeNATSTLSConf writes kubernetes-tls.conf into dir with its certificate
// paths pointing at a fresh test CA's files (a nats-role server certificate
// for 127.0.0.1) and returns the file and the CA.
func writeNATSTLSConf(t *testing.T, dir string) (string, *pki.CA) {
	t.Helper()
	ca, err := pki.NewCA("tether-test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue("nats-1", pki.IssueOptions{Role: pki.RoleNATS, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	files, err := ca.WriteFiles(dir, "nats-1", leaf)
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(k8sNATSTLSFile)
	if err != nil {
		t.Fatal(err)
	}
	conf := string(src)
	for from, to := range map[string]string{"/etc/nats/tls/tls.crt": files.Cert, "/etc/nats/tls/tls.key": files.Key, "/etc/nats/tls/ca.crt": files.CA} {
		if !strings.Contains(conf, strconv.Quote(from)) {
			t.Fatalf("%s: no %q to point at the test certificates", k8sNATSTLSFile, from)
		}
		conf = strings.ReplaceAll(conf, strconv.Quote(from), strconv.Quote(to))
	}
	path := filepath.Join(dir, "kubernetes-tls.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, ca
}

// natsClient connects to ns presenting a certificate for id in role,
// issued by ca; async errors (permission violations) go to errs.
func natsClient(t *testing.T, ns *natsserver.Server, ca *pki.CA, role pki.Role, id string, errs chan<- error) (*nats.Conn, error) {
	t.Helper()
	leaf, err := ca.Issue(id, pki.IssueOptions{Role: role})
	if err != nil {
		t.Fatal(err)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca.Pool(), Certificates: []tls.Certificate{leaf.TLS}}
	nc, err := nats.Connect(ns.ClientURL(), nats.Secure(tc), nats.NoReconnect(), nats.Name(id),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

// The shipped Kubernetes NATS configuration on a real nats-server
// (kubernetes-tls.conf with test certificates, kubernetes-auth.conf as
// shipped): a client presenting worker tether-context-workers-0's
// certificate may publish its own load subject, and is refused another
// instance's load subject and dump requests; a certificate for an ordinal
// the file does not list, or with no tether identity, cannot connect; an
// edge's certificate reads the telemetry.
func TestKubernetesNATSAuthorizationOnARealServer(t *testing.T) {
	ns, ca, _ := startShippedK8sNATS(t)

	const self, other = "tether-context-workers-0", "tether-context-workers-1"
	edgeErrs := make(chan error, 8)
	edgeConn, err := natsClient(t, ns, ca, pki.RoleEdge, "tether-edge-0", edgeErrs)
	if err != nil {
		t.Fatalf("edge tether-edge-0: %v", err)
	}
	heard, err := edgeConn.SubscribeSync("tether.v1.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := edgeConn.Flush(); err != nil {
		t.Fatal(err)
	}

	workerErrs := make(chan error, 8)
	w, err := natsClient(t, ns, ca, pki.RoleWorker, self, workerErrs)
	if err != nil {
		t.Fatalf("worker %s: %v", self, err)
	}
	forged := telemetry.LoadSubject(telemetry.FleetContext, other)
	own := telemetry.LoadSubject(telemetry.FleetContext, self)
	if err := w.Publish(forged, []byte("forged")); err != nil {
		t.Fatal(err)
	}
	if err := w.Publish(own, []byte("own")); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	// One connection's messages arrive in order: the forged one, had the
	// server passed it, would come first.
	msg, err := heard.NextMsg(10 * time.Second)
	if err != nil || msg.Subject != own {
		t.Fatalf("the edge's first telemetry message: %v %v; want the worker's own report on %s (the forged %s refused)", msgSubject(msg), err, own, forged)
	}
	waitPermissionViolation(t, workerErrs, "Publish to \""+forged+"\"")
	if _, err := w.SubscribeSync(telemetry.KVDumpSubject(other)); err != nil {
		t.Fatal(err)
	}
	waitPermissionViolation(t, workerErrs, "Subscription to \""+telemetry.KVDumpSubject(other)+"\"")

	unlisted := fmt.Sprintf("tether-context-workers-%d", len(natsIdentitySetIDs(t, "tether-context-workers")))
	if nc, err := natsClient(t, ns, ca, pki.RoleWorker, unlisted, make(chan error, 1)); err == nil {
		nc.Close()
		t.Errorf("worker %s (an ordinal the authorization does not list) connected", unlisted)
	}
	if nc, err := natsClient(t, ns, ca, "", self, make(chan error, 1)); err == nil {
		nc.Close()
		t.Errorf("a certificate without a tether identity (CN and DNS name %s) connected", self)
	}
}

func msgSubject(m *nats.Msg) string {
	if m == nil {
		return "no message"
	}
	return "message on " + m.Subject
}

// natsIdentitySetIDs are the pods of set the authorization lists.
func natsIdentitySetIDs(t *testing.T, set string) []string {
	t.Helper()
	for _, s := range natsIdentitySets(t) {
		if s.set == set {
			return s.ids()
		}
	}
	t.Fatalf("no StatefulSet %s", set)
	return nil
}

// waitPermissionViolation waits for the server's permissions violation
// naming what (e.g. `Publish to "subject"`).
func waitPermissionViolation(t *testing.T, errs <-chan error, what string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case err := <-errs:
			if strings.Contains(err.Error(), "Permissions Violation") && strings.Contains(err.Error(), what) {
				return
			}
		case <-deadline:
			t.Fatalf("no permissions violation for %s", what)
		}
	}
}

// `tether worker --advertise-url` (how a StatefulSet pod advertises its
// DNS name while listening on its pod IP): the binary's load reports carry
// the flag's URL, and --instance-id's id on its subject.
func TestWorkerAdvertiseURLFlag(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the tether binary")
	}
	bin := tetherBin(t)
	ns := natstest.Start(t, nil)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const id = "tether-context-workers-3"
	const url = "https://tether-context-workers-3.tether-context-workers.tether.svc.cluster.local:9000"
	reports, err := nc.SubscribeSync(telemetry.LoadSubject(telemetry.FleetContext, id))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "worker.yaml")
	if err := os.WriteFile(cfg, []byte("instance_id: placeholder\nfleet: context\nserver_role: context\nmodel: m\ntls: {mode: plaintext}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "worker", "--config", cfg, "--port", "0", "--instance-id", id, "--advertise-url", url, "--nats", ns.ClientURL())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}()
	msg, err := reports.NextMsg(30 * time.Second)
	if err != nil {
		t.Fatalf("no load report from the worker: %v\n%s", err, stderr.String())
	}
	r, err := telemetry.DecodeLoad(msg.Subject, msg.Data)
	if err != nil || r.URL != url {
		t.Fatalf("load report %+v (%v): want url %s", r, err, url)
	}
}

// permString shows permissions by value (they are pointers).
func permString(p *natsserver.Permissions) string {
	if p == nil {
		return "none"
	}
	var b strings.Builder
	if p.Publish != nil {
		fmt.Fprintf(&b, "publish allow %v deny %v; ", p.Publish.Allow, p.Publish.Deny)
	}
	if p.Subscribe != nil {
		fmt.Fprintf(&b, "subscribe allow %v deny %v; ", p.Subscribe.Allow, p.Subscribe.Deny)
	}
	if p.Response != nil {
		fmt.Fprintf(&b, "responses %d within %v", p.Response.MaxMsgs, p.Response.Expires)
	}
	return b.String()
}

// checkPodsPresentTheirIdentity: the certificate each pod of set m mounts
// (a csi-driver volume, or cert-manager Certificates behind a projected
// Secret volume) names the identity the NATS authorization lists for it,
// spiffe://tether/<role>/<pod name>.
func checkPodsPresentTheirIdentity(t *testing.T, m manifest, role pki.Role, replicas int, ms []manifest) {
	t.Helper()
	c, _ := tetherContainer(m)
	tlsDir := ""
	for _, vm := range list(c, "volumeMounts") {
		if str(vm, "name") == "tls" {
			tlsDir = str(vm, "mountPath")
		}
	}
	attrs := csiAttributes(m, c, tlsDir)
	secretURIs := map[string]bool{} // URIs of the Certificates behind the projected volume
	for _, v := range list(m.doc, "spec", "template", "spec", "volumes") {
		if str(v, "name") != "tls" {
			continue
		}
		for _, src := range list(v, "projected", "sources") {
			for _, cert := range ms {
				if cert.kind() == "Certificate" && str(cert.doc, "spec", "secretName") == str(src, "secret", "name") {
					for _, u := range list(cert.doc, "spec", "uris") {
						s, _ := u.(string)
						secretURIs[s] = true
					}
				}
			}
		}
	}
	ns := str(m.doc, "metadata", "namespace")
	for i := range replicas {
		pod := fmt.Sprintf("%s-%d", m.name(), i)
		want := pki.IdentityURI(role, pod)
		if attrs != nil {
			got, _ := attrs["csi.cert-manager.io/uri-sans"].(string)
			if got = strings.NewReplacer("${POD_NAME}", pod, "${POD_NAMESPACE}", ns).Replace(got); got != want {
				t.Errorf("StatefulSet %s: pod %s's certificate names %q, not its NATS user %s", m.name(), pod, got, want)
			}
		} else if !secretURIs[want] {
			t.Errorf("StatefulSet %s: no certificate mounted by pod %s names its NATS user %s", m.name(), pod, want)
		}
	}
}

// startShippedK8sNATS runs a real nats-server with kubernetes-tls.conf
// (test certificates) and kubernetes-auth.conf as shipped; it returns the
// server, the test CA and the directory holding its files.
func startShippedK8sNATS(t *testing.T) (*natsserver.Server, *pki.CA, string) {
	t.Helper()
	dir := t.TempDir()
	_, ca := writeNATSTLSConf(t, dir)
	auth, err := os.ReadFile(k8sNATSAuthFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kubernetes-auth.conf"), auth, 0o644); err != nil {
		t.Fatal(err)
	}
	main := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(main, []byte("include ./kubernetes-tls.conf\ninclude ./kubernetes-auth.conf\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts, err := natsserver.ProcessConfigFile(main)
	if err != nil {
		t.Fatal(err)
	}
	return natstest.Start(t, opts), ca, dir
}

// The shipped context worker configuration (20-worker-config.yaml, its
// engine replaced by the simulated one, addresses and certificate files by
// the test's) runs as pod tether-context-workers-0 against the shipped
// Kubernetes NATS configuration: with only its pod certificate for NATS
// credentials it registers on its own subject with the URL it advertises,
// and answers an edge's KV dump request (a reply the server lets through
// as a response to a request it received).
func TestKubernetesWorkerRegistersWithItsCertificate(t *testing.T) {
	setSecretEnv(t)
	ns, ca, dir := startShippedK8sNATS(t)
	const pod = "tether-context-workers-0"
	var cm manifest
	for _, m := range loadManifests(t) {
		if m.kind() == "ConfigMap" && m.name() == "tether-worker-config" {
			cm = m
		}
	}
	cfg, err := worker.ParseConfig([]byte(keysOf(cm)["context.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(pod, pki.IssueOptions{Role: pki.RoleWorker, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	files, err := ca.WriteFiles(dir, pod, leaf)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATS.TLS.CertFile != cfg.TLS.CertFile || cfg.NATS.NKeySeedFile != "" {
		t.Fatalf("context.yaml: the NATS identity is not the pod certificate: %+v", cfg.NATS)
	}
	cfg.InstanceID, cfg.Hostname, cfg.Port = pod, "127.0.0.1", 0
	cfg.Engine = worker.DefaultConfig().Engine
	cfg.Engine.EmulateDisaggregation = false
	cfg.TLS.CAFile, cfg.TLS.CertFile, cfg.TLS.KeyFile = files.CA, files.Cert, files.Key
	cfg.NATS.TLS.CAFile, cfg.NATS.TLS.CertFile, cfg.NATS.TLS.KeyFile = files.CA, files.Cert, files.Key
	cfg.NATS.URLs = []string{strings.Replace(ns.ClientURL(), "nats://", "tls://", 1)}
	cfg.AdvertiseURL = "https://" + pod + ".tether-context-workers.tether.svc.cluster.local:9000"
	cfg.Logger = quietLogger()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}

	edgeConn, err := natsClient(t, ns, ca, pki.RoleEdge, "tether-edge-0", make(chan error, 8))
	if err != nil {
		t.Fatal(err)
	}
	reports, err := edgeConn.SubscribeSync(telemetry.LoadSubject(telemetry.FleetContext, pod))
	if err != nil {
		t.Fatal(err)
	}
	if err := edgeConn.Flush(); err != nil {
		t.Fatal(err)
	}
	workertest.Start(t, worker.New, cfg)
	msg, err := reports.NextMsg(30 * time.Second)
	if err != nil {
		t.Fatalf("no load report from %s: %v", pod, err)
	}
	r, err := telemetry.DecodeLoad(msg.Subject, msg.Data)
	if err != nil || r.Instance != pod || r.URL != cfg.AdvertiseURL {
		t.Fatalf("load report %+v (%v): want instance %s at %s", r, err, pod, cfg.AdvertiseURL)
	}
	reply, err := edgeConn.Request(telemetry.KVDumpSubject(pod), nil, 30*time.Second)
	if err != nil {
		t.Fatalf("KV dump request to %s: %v", pod, err)
	}
	if _, err := telemetry.DecodeKVDump(telemetry.KVDumpSubject(pod), reply.Data); err != nil {
		t.Fatalf("KV dump reply from %s: %v", pod, err)
	}
}
