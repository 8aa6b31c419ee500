package ops

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"gopkg.in/yaml.v3"
)

// recordedSeries are the record names of deploy/prometheus/tether-rules.yaml.
func recordedSeries(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployDir, "prometheus", "tether-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rf struct {
		Groups []struct {
			Rules []struct {
				Record string `yaml:"record"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &rf); err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				out[r.Record] = true
			}
		}
	}
	return out
}

var recordedName = regexp.MustCompile(`tether:[a-zA-Z0-9_:]+`)

// checkRecordedQuery: a query an autoscaler runs names only series the
// shipped rules record (test/monitoring runs them on a real Prometheus).
func checkRecordedQuery(t *testing.T, where, q string, records map[string]bool) {
	t.Helper()
	names := recordedName.FindAllString(q, -1)
	if len(names) == 0 {
		t.Errorf("%s: query %q uses no tether:* recorded series", where, q)
	}
	for _, n := range names {
		if !records[n] {
			t.Errorf("%s: query %q uses %s, which deploy/prometheus/tether-rules.yaml does not record", where, q, n)
		}
	}
}

// The autoscaling examples parse; the KEDA ScaledObject and the HPA scale a
// StatefulSet of the base manifests on queries of series the shipped rules
// record, and the HPA's external metrics are the ones the Prometheus
// adapter's rules define.
func TestKubernetesAutoscalingExamples(t *testing.T) {
	base := map[string]manifest{}
	for _, m := range loadManifests(t) {
		if m.kind() == "StatefulSet" {
			base[m.name()] = m
		}
	}
	records := recordedSeries(t)
	byKind := map[string][]manifest{}
	for _, path := range globDeploy(t, "kubernetes/autoscaling/*.yaml") {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if doc == nil {
				continue
			}
			m := manifest{file: filepath.Base(path), doc: doc}
			if str(doc, "apiVersion") == "" || m.kind() == "" || m.name() == "" {
				t.Fatalf("%s: a document without apiVersion, kind or metadata.name", path)
			}
			byKind[m.kind()] = append(byKind[m.kind()], m)
		}
	}
	target := func(m manifest) {
		ref := dig(m.doc, "spec", "scaleTargetRef")
		d, ok := base[str(ref, "name")]
		if str(ref, "kind") != "StatefulSet" || !ok {
			t.Errorf("%s %s: scales %s/%s, not a StatefulSet of deploy/kubernetes", m.file, m.kind(), str(ref, "kind"), str(ref, "name"))
		} else if str(d.doc, "metadata", "namespace") != str(m.doc, "metadata", "namespace") {
			t.Errorf("%s: namespace %s, the StatefulSet's is %s", m.file, str(m.doc, "metadata", "namespace"), str(d.doc, "metadata", "namespace"))
		}
	}
	if len(byKind["ScaledObject"]) != 1 || len(byKind["HorizontalPodAutoscaler"]) != 1 || len(byKind["ConfigMap"]) != 1 {
		t.Fatalf("want one ScaledObject, one HorizontalPodAutoscaler and the adapter's ConfigMap, have %v", byKind)
	}
	so := byKind["ScaledObject"][0]
	if str(so.doc, "apiVersion") != "keda.sh/v1alpha1" {
		t.Errorf("ScaledObject apiVersion %s", str(so.doc, "apiVersion"))
	}
	target(so)
	lo, _ := dig(so.doc, "spec", "minReplicaCount").(int)
	hi, _ := dig(so.doc, "spec", "maxReplicaCount").(int)
	if lo < 1 || hi < lo {
		t.Errorf("ScaledObject replicas %d..%d", lo, hi)
	}
	triggers := list(so.doc, "spec", "triggers")
	if len(triggers) == 0 {
		t.Error("ScaledObject has no triggers")
	}
	for _, tr := range triggers {
		if str(tr, "type") != "prometheus" {
			t.Errorf("trigger %s: type %s", str(tr, "name"), str(tr, "type"))
			continue
		}
		checkRecordedQuery(t, "trigger "+str(tr, "name"), str(tr, "metadata", "query"), records)
		if v, err := strconv.ParseFloat(str(tr, "metadata", "threshold"), 64); err != nil || v <= 0 {
			t.Errorf("trigger %s: threshold %q", str(tr, "name"), str(tr, "metadata", "threshold"))
		}
		if str(tr, "metadata", "serverAddress") == "" {
			t.Errorf("trigger %s: no serverAddress", str(tr, "name"))
		}
	}

	var adapter struct {
		ExternalRules []struct {
			SeriesQuery  string `yaml:"seriesQuery"`
			MetricsQuery string `yaml:"metricsQuery"`
			Name         struct {
				As string `yaml:"as"`
			} `yaml:"name"`
		} `yaml:"externalRules"`
	}
	if err := yaml.Unmarshal([]byte(str(byKind["ConfigMap"][0].doc, "data", "config.yaml")), &adapter); err != nil {
		t.Fatalf("prometheus-adapter config: %v", err)
	}
	external := map[string]bool{}
	for _, r := range adapter.ExternalRules {
		checkRecordedQuery(t, "adapter rule "+r.Name.As, r.SeriesQuery, records)
		external[r.Name.As] = true
	}
	hpa := byKind["HorizontalPodAutoscaler"][0]
	if str(hpa.doc, "apiVersion") != "autoscaling/v2" {
		t.Errorf("HPA apiVersion %s", str(hpa.doc, "apiVersion"))
	}
	target(hpa)
	for _, m := range list(hpa.doc, "spec", "metrics") {
		name := str(m, "external", "metric", "name")
		if str(m, "type") != "External" || !external[name] {
			t.Errorf("HPA metric %s/%s: not an external metric the adapter's rules define (%v)", str(m, "type"), name, external)
		}
	}
}
