package yamlconf

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

type peer struct {
	ID      string        `yaml:"id"`
	Addr    string        `yaml:"addr"`
	Timeout time.Duration `yaml:"timeout"`
	Weight  int           `yaml:"weight"`
}

type inlined struct {
	Enabled bool `yaml:"enabled"`
}

type level string

// UnmarshalText refuses anything but low and high, as the routing enums do.
func (l *level) UnmarshalText(b []byte) error {
	switch string(b) {
	case "low", "high":
		*l = level(b)
		return nil
	}
	return fmt.Errorf("level: unknown value %q (allowed: low, high)", b)
}

// either is a string or {name, url}, as edge's urls entries are; the
// mapping form goes through DecodeNode.
type either struct {
	Name string `yaml:"name"`
	URL  string `yaml:"url"`
}

func (e *either) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		e.URL = n.Value
		return nil
	}
	type plain either
	return DecodeNode(n, (*plain)(e))
}

type config struct {
	Name    string        `yaml:"name"`
	Port    int           `yaml:"port"`
	Ratio   float64       `yaml:"ratio"`
	Count   uint64        `yaml:"count"`
	TTL     time.Duration `yaml:"ttl"`
	Tags    []string      `yaml:"tags"`
	Level   level         `yaml:"level"`
	Cluster struct {
		Peers []peer `yaml:"peers"`
	} `yaml:"cluster"`
	URLs    []either          `yaml:"urls"`
	Labels  map[string]string `yaml:"labels"`
	Extra   inlined           `yaml:",inline"`
	Ignored string            `yaml:"-"`
	hidden  int
}

func TestDecodeFillsOverDefaults(t *testing.T) {
	c := config{Name: "default", Port: 80, TTL: time.Minute, Tags: []string{"a"}}
	doc := `
port: 8080
ratio: 2
ttl: 500ms
tags: [x, y]
level: high
enabled: true
name:
cluster:
  peers:
    - {id: e1, addr: "a:1", timeout: 2s}
urls: ["http://a", {name: w2, url: "http://b"}]
labels: {zone: a}
`
	if err := Decode([]byte(doc), &c); err != nil {
		t.Fatal(err)
	}
	if c.Name != "default" || c.Port != 8080 || c.Ratio != 2 || c.TTL != 500*time.Millisecond || strings.Join(c.Tags, ",") != "x,y" ||
		c.Level != "high" || !c.Extra.Enabled || c.Cluster.Peers[0].Timeout != 2*time.Second || c.URLs[1].Name != "w2" ||
		c.URLs[0].URL != "http://a" || c.Labels["zone"] != "a" {
		t.Fatalf("decoded %+v", c)
	}
}

func TestDecodeErrorsNameThePathAndLine(t *testing.T) {
	cases := []struct{ name, doc, want string }{
		{"type error in a nested list item", "cluster:\n  peers:\n    - {id: e1, addr: \"a:1\"}\n    - id: e2\n      weight: heavy\n",
			`cluster.peers[1].weight, line 5: want an integer, got "heavy"`},
		{"duration in a list item", "cluster:\n  peers:\n    - {id: e1, timeout: 2}\n",
			`cluster.peers[0].timeout, line 3: want a duration such as "100ms" or "2s", got "2"`},
		{"unknown key", "port: 1\ncolour: blue\n", "colour, line 2: unknown key"},
		{"unknown nested key", "cluster:\n  peers:\n    - {id: e1, adr: x}\n", "cluster.peers[0].adr, line 3: unknown key"},
		{"typo", "ttls: 2s\n", "ttls, line 1: unknown key (did you mean ttl?)"},
		{"typo of an inlined key", "enabeld: true\n", "enabeld, line 1: unknown key (did you mean enabled?)"},
		{"small section", "cluster:\n  peers:\n    - {id: e1, color: x}\n", "cluster.peers[0].color, line 3: unknown key (allowed: id, addr, timeout, weight)"},
		{"duplicate key", "port: 1\nname: a\nport: 2\n", "port, line 3: duplicate key (first given on line 1)"},
		{"tab", "cluster:\n\tpeers: []\n", "invalid YAML: line 2: found character that cannot start any token (a tab"},
		{"syntax", "port: [1,\n", "invalid YAML: line "},
		{"float into an integer", "port: 1.5\n", `port, line 1: want an integer, got "1.5"`},
		{"quoted integer", "port: \"80\"\n", `port, line 1: want an integer, got "80"`},
		{"negative unsigned", "count: -1\n", `count, line 1: want a non-negative integer, got "-1"`},
		{"list for a string", "name: [a]\n", "name, line 1: want a string, got a list"},
		{"scalar for a section", "cluster: 5\n", `cluster, line 1: want a mapping of keys, got "5"`},
		{"scalar for a list", "tags: x\n", `tags, line 1: want a list of strings, got "x"`},
		{"custom text decoder", "level: mid\n", `level, line 1: unknown value "mid" (allowed: low, high)`},
		{"list for a text type", "level: [low]\n", "level, line 1: want a string, got a list"},
		{"nested DecodeNode", "urls:\n  - http://a\n  - {url: http://b, weight: 2}\n", "urls[1].weight, line 3: unknown key"},
		{"unexported field", "hidden: 1\n", "hidden, line 1: unknown key"},
		{"field tagged -", "ignored: x\n", "ignored, line 1: unknown key"},
		{"not a mapping", "- a\n", "configuration, line 1: want a mapping of keys, got a list"},
		{"flow mapping on one line", "cluster: {peers: [{id: a, weight: 1}, {id: b, weight: x}]}\n", `cluster.peers[1].weight, line 1: want an integer, got "x"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c config
			err := Decode([]byte(tc.doc), &c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

func TestDecodeReportsEveryProblem(t *testing.T) {
	var c config
	err := Decode([]byte("port: x\ncolour: blue\nttl: 5\n"), &c)
	var es Errors
	if !errors.As(err, &es) || len(es) != 3 {
		t.Fatalf("want three errors, got %v", err)
	}
	if es[0].Path != "port" || es[1].Path != "colour" || es[2].Path != "ttl" || es[2].Line != 3 {
		t.Fatalf("errors %v", err)
	}
}

func TestDecodeBoundsTheReport(t *testing.T) {
	var b strings.Builder
	for i := range 100 {
		fmt.Fprintf(&b, "unknown%d: 1\n", i)
	}
	var c config
	err := Decode([]byte(b.String()), &c)
	var es Errors
	if !errors.As(err, &es) || len(es) != maxErrors+1 || es[maxErrors].Error() != "configuration: 80 more problems not shown" {
		t.Fatalf("got %d errors: %v", len(es), err)
	}
}

func TestDecodeEmpty(t *testing.T) {
	for _, doc := range []string{"", "# only a comment\n", "\n\n"} {
		var c config
		if err := Decode([]byte(doc), &c); !errors.Is(err, ErrEmpty) {
			t.Errorf("%q: %v, want ErrEmpty", doc, err)
		}
	}
}

// Anchors, aliases and merge keys work as in yaml.v3: keys given beside a
// merge win over the merged ones.
func TestDecodeMergeKeys(t *testing.T) {
	doc := "cluster:\n  peers:\n    - &p {id: e1, addr: \"a:1\", weight: 2}\n    - {id: e2, <<: *p}\n    - *p\n"
	var c config
	if err := Decode([]byte(doc), &c); err != nil {
		t.Fatal(err)
	}
	p := c.Cluster.Peers
	if len(p) != 3 || p[1].ID != "e2" || p[1].Addr != "a:1" || p[1].Weight != 2 || p[2].ID != "e1" {
		t.Fatalf("peers %+v", p)
	}
	err := Decode([]byte("cluster:\n  peers:\n    - &p {id: e1, wieght: 2}\n    - {<<: *p}\n"), &c)
	if err == nil || !strings.Contains(err.Error(), "cluster.peers[0].wieght, line 3: unknown key") {
		t.Fatalf("unknown key in an anchored mapping: %v", err)
	}
}

// A document whose aliases expand exponentially (each level merges ten
// copies of the one before) is refused before it is walked.
func TestDecodeBoundsAliasExpansion(t *testing.T) {
	var b strings.Builder
	b.WriteString("k0: &a0 {id: e, addr: a}\n")
	for i := 1; i <= 12; i++ {
		fmt.Fprintf(&b, "k%d: &a%d {<<: [", i, i)
		for j := range 10 {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*a%d", i-1)
		}
		b.WriteString("]}\n")
	}
	var m map[string]peer
	err := Decode([]byte(b.String()), &m)
	if err == nil || !strings.Contains(err.Error(), "configuration, line 1: its aliases expand to more than") {
		t.Fatalf("alias bomb: %v", err)
	}
	// yaml.v3 parses an alias inside its own anchor; walking it would
	// not end.
	for _, doc := range []string{"cluster: &a {peers: [*a]}\n", "tags: &t [*t]\n"} {
		var c config
		if err := Decode([]byte(doc), &c); err == nil || !strings.Contains(err.Error(), "refer to themselves") {
			t.Fatalf("%q: %v", doc, err)
		}
	}
}

func TestDecodeNullKeepsTheDefault(t *testing.T) {
	c := config{Port: 80, Tags: []string{"a"}}
	if err := Decode([]byte("port: ~\ntags:\n"), &c); err != nil || c.Port != 80 || len(c.Tags) != 1 {
		t.Fatalf("%+v %v", c, err)
	}
}

func TestApplyEnv(t *testing.T) {
	env := map[string]string{"KEY": "from-env", "SKIPPED": "from-env", "EMPTY": ""}
	key, skipped, empty := "file", "file", "file"
	ApplyEnv(func(k string) string { return env[k] },
		EnvSecret{Var: "KEY", Dst: &key},
		EnvSecret{Var: "SKIPPED", Dst: &skipped, Skip: true},
		EnvSecret{Var: "EMPTY", Dst: &empty},
	)
	if key != "from-env" || skipped != "file" || empty != "file" {
		t.Fatalf("key %q skipped %q empty %q", key, skipped, empty)
	}
}

// FuzzDecode: any document decodes or is refused with a message; nothing
// panics.
func FuzzDecode(f *testing.F) {
	f.Add("port: 1\ncluster: {peers: [{id: a, timeout: 2s}]}\nurls: [x, {name: n}]\n")
	f.Add("a: &a {id: x}\ncluster: {peers: [*a, {<<: *a}]}\n")
	f.Add("level: [\n")
	f.Add("\t- x")
	f.Add("cluster: &a {peers: [*a]}\n")
	f.Fuzz(func(t *testing.T, doc string) {
		var c config
		if err := Decode([]byte(doc), &c); err != nil && err.Error() == "" {
			t.Fatalf("empty error for %q", doc)
		}
	})
}
