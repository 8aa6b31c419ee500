// Package imports keeps the import graph equal to the table in
// docs/ARCHITECTURE.md ("Packages and the direction of imports"): every
// package of the module must have a row, and a package may import, among the
// module's packages, only what its row's "may import" column names. A change
// that needs a new edge changes the table in the same commit, where a reviewer
// sees it.
package imports

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/tether-project/tether"

// forbiddenInBinary are module prefixes the production binary must not link:
// the benchmark report's plotting stack (fonts, LaTeX, PDF) belongs to
// cmd/tether-bench.
var forbiddenInBinary = []string{
	"gonum.org/v1/plot", "codeberg.org/go-latex", "codeberg.org/go-pdf",
	"codeberg.org/go-fonts", "git.sr.ht/~sbinet/gg", "github.com/ajstarks/svgo",
}

type goPackage struct {
	ImportPath string
	Imports    []string
	Deps       []string // with go list of a main package: everything it links
}

func TestImportsFollowArchitectureTable(t *testing.T) {
	root := repoRoot(t)
	rules, err := parseTable(filepath.Join(root, "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range listPackages(t, root, "./...") {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		rule, ok := rules.lookup(rel)
		if !ok {
			t.Errorf("%s has no row in docs/ARCHITECTURE.md's package table: add one with what it may import", rel)
			continue
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			dep := strings.TrimPrefix(imp, module+"/")
			if !rule.allows(dep) {
				t.Errorf("%s imports %s, which its row in docs/ARCHITECTURE.md (%q) does not allow", rel, dep, rule.text)
			}
		}
	}
}

func TestBinaryDoesNotLinkReportPlots(t *testing.T) {
	root := repoRoot(t)
	for _, p := range listPackages(t, root, "./cmd/tether") {
		for _, bad := range forbiddenInBinary {
			for _, dep := range p.Deps {
				if strings.HasPrefix(dep, bad) {
					t.Errorf("cmd/tether links %s: the report's plotting belongs to cmd/tether-bench", dep)
					break
				}
			}
		}
	}
}

func TestTableParsing(t *testing.T) {
	rules, err := parseRows([]string{
		"| `a` | x | stdlib only |",
		"| `b`, `b/c` | x | a, d/* |",
		"| `d` | x | a (+ subpackages), e (types only) |",
		"| `cmd/x` | x | everything |",
		"| `test/*` | x | everything |",
	})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		pkg, dep string
		want     bool
	}{
		{"a", "b", false}, {"b", "a", true}, {"b/c", "d/x", true}, {"b", "d", false},
		{"d", "a/z", true}, {"d", "e", true}, {"d", "e/f", false}, {"cmd/x", "d", true},
		{"test/e2e", "a", true},
	}
	for _, c := range cases {
		r, ok := rules.lookup(c.pkg)
		if !ok {
			t.Fatalf("no rule for %s", c.pkg)
		}
		if got := r.allows(c.dep); got != c.want {
			t.Errorf("%s -> %s: allows = %v, want %v", c.pkg, c.dep, got, c.want)
		}
	}
	if _, ok := rules.lookup("zzz"); ok {
		t.Error("an unlisted package matched a row")
	}
}

// rule is one row of the table: the packages it covers and what they may import.
type rule struct {
	text     string
	any      bool
	exact    map[string]bool
	prefixes []string // "x/" for x/* and x (+ subpackages)
}

func (r rule) allows(dep string) bool {
	if r.any || r.exact[dep] {
		return true
	}
	for _, p := range r.prefixes {
		if strings.HasPrefix(dep, p) {
			return true
		}
	}
	return false
}

type rules struct {
	exact    map[string]rule
	prefixed map[string]rule // "test/" for test/*
}

func (rs rules) lookup(pkg string) (rule, bool) {
	if r, ok := rs.exact[pkg]; ok {
		return r, true
	}
	for p, r := range rs.prefixed {
		if strings.HasPrefix(pkg, p) {
			return r, true
		}
	}
	return rule{}, false
}

var codeSpan = regexp.MustCompile("`([^`]+)`")

func parseTable(path string) (rules, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return rules{}, err
	}
	var rows []string
	in := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## Packages and the direction of imports"):
			in = true
		case in && strings.HasPrefix(line, "## "):
			in = false
		case in && strings.HasPrefix(line, "| `"):
			rows = append(rows, line)
		}
	}
	if len(rows) == 0 {
		return rules{}, fmt.Errorf("%s: no package table under \"## Packages and the direction of imports\"", path)
	}
	return parseRows(rows)
}

func parseRows(rows []string) (rules, error) {
	rs := rules{exact: map[string]rule{}, prefixed: map[string]rule{}}
	for _, row := range rows {
		cells := strings.Split(strings.Trim(row, "| "), "|")
		if len(cells) < 3 {
			return rs, fmt.Errorf("package table row %q: want | packages | responsibility | may import |", row)
		}
		r := parseAllowed(strings.TrimSpace(cells[len(cells)-1]))
		for _, m := range codeSpan.FindAllStringSubmatch(cells[0], -1) {
			if p, ok := strings.CutSuffix(m[1], "/*"); ok {
				rs.prefixed[p+"/"] = r
			} else {
				rs.exact[m[1]] = r
			}
		}
	}
	return rs, nil
}

// parseAllowed reads a "may import" cell: comma-separated package paths, where
// "x/*" is every package below x, "x (+ subpackages)" is x and every package
// below it, other parenthesised text is a comment, "stdlib…" and "… via the
// caller" name no package of the module, and "everything" allows all.
func parseAllowed(cell string) rule {
	r := rule{text: cell, exact: map[string]bool{}}
	for _, item := range strings.Split(cell, ",") {
		item = strings.TrimSpace(item)
		sub := strings.Contains(item, "(+ subpackages)")
		if i := strings.Index(item, "("); i >= 0 {
			item = strings.TrimSpace(item[:i])
		}
		switch {
		case item == "everything":
			r.any = true
		case item == "" || strings.HasPrefix(item, "stdlib") || strings.HasSuffix(item, "via the caller"):
		case strings.HasSuffix(item, "/*"):
			r.prefixes = append(r.prefixes, strings.TrimSuffix(item, "*"))
		default:
			r.exact[item] = true
			if sub {
				r.prefixes = append(r.prefixes, item+"/")
			}
		}
	}
	sort.Strings(r.prefixes)
	return r
}

func listPackages(t *testing.T, root, pattern string) []goPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", pattern)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", pattern, err, stderr.String())
	}
	var pkgs []goPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p goPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go list %s: decode: %v", pattern, err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
