package yamlconf

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

type renamed struct {
	NATS struct {
		CredsFile string   `yaml:"creds_file" was:"creds"`
		URLs      []string `yaml:"urls" was:"url"`
		User      string   `yaml:"user"`
	} `yaml:"nats"`
	Peers []peer `yaml:"peers"`
}

func TestDocLinesAndDeprecatedSpellings(t *testing.T) {
	var c renamed
	doc, err := DecodeDoc([]byte(`
nats:
  creds: /etc/n.creds
  url: nats://a:4222, nats://b:4222
peers:
  - id: e1
    addr: x
`), &c)
	if err != nil {
		t.Fatal(err)
	}
	if c.NATS.CredsFile != "/etc/n.creds" || fmt.Sprint(c.NATS.URLs) != "[nats://a:4222 nats://b:4222]" {
		t.Fatalf("decoded %+v", c.NATS)
	}
	if len(doc.Deprecated) != 2 || doc.Deprecated[0].Error() != "nats.creds, line 3: deprecated spelling: write nats.creds_file (read the same way for now)" ||
		!strings.HasPrefix(doc.Deprecated[1].Error(), "nats.url, line 4: deprecated spelling: write nats.urls") {
		t.Fatalf("deprecated: %v", doc.Deprecated)
	}
	for path, want := range map[string]int{
		"nats": 2, "nats.creds_file": 3, "nats.urls": 4, "peers[0]": 6, "peers[0].addr": 7,
		"nats.user":       2, // not in the file: its section's line
		"peers[0].weight": 6, "tls.mode": 0,
	} {
		if got := doc.Line(path); got != want {
			t.Errorf("Line(%q) = %d, want %d", path, got, want)
		}
	}
}

func TestBothSpellingsRefused(t *testing.T) {
	var c renamed
	_, err := DecodeDoc([]byte("nats:\n  creds_file: a\n  creds: b\n"), &c)
	if err == nil || !strings.Contains(err.Error(), "nats.creds, line 3: given twice, as creds_file on line 2 and as creds") {
		t.Fatalf("err = %v", err)
	}
}

func TestProblemsPlaceFindingsAtTheirLines(t *testing.T) {
	var c renamed
	doc, err := DecodeDoc([]byte("nats:\n  user: u\npeers:\n  - {id: a}\n"), &c)
	if err != nil {
		t.Fatal(err)
	}
	p := NewProblems(doc)
	p.Add("nats.user", "needs a password")
	p.AddError("", errors.Join(errors.New("peers[0].addr: required"), errors.New("something without a key")))
	p.AddError("nats", fmt.Errorf("user: %s", "again"))
	want := "nats.user, line 2: needs a password; peers[0].addr, line 4: required; " +
		"configuration: something without a key; nats.user, line 2: again"
	if err := p.Err(); err == nil || err.Error() != want {
		t.Fatalf("got  %v\nwant %s", err, want)
	}
	if NewProblems(nil).Err() != nil {
		t.Fatal("no problems is not nil")
	}
	q := NewProblems(nil)
	q.Add("port", "out of range")
	if q.Err().Error() != "port: out of range" {
		t.Fatalf("without a document: %v", q.Err())
	}
}
