// Package imports keeps the import graph equal to the table in
// docs/ARCHITECTURE.md ("Packages and the direction of imports"): every
// package of the module must have a row, and a package may import, among the
// module's packages, only what its row's "may import" column names. The
// column also binds the rest: "stdlib only" admits no module outside the
// standard library; a row that names external modules (a path whose first
// element has a dot, e.g. golang.org/x/text) admits only those; "no I/O"
// refuses the standard library's network, file, process, logging and
// randomness packages (ioPackages). A change that needs a new edge changes
// the table in the same commit, where a reviewer sees it.
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

	"github.com/tether-project/tether/test/repo"
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
	root := repo.Root(t)
	rules, err := parseTable(filepath.Join(root, "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range listPackages(t, root, "./...") {
		for _, v := range violations(rules, p) {
			t.Error(v)
		}
	}
}

// ioPackages are the standard library packages a "no I/O" row refuses (a
// prefix: net covers net/http).
var ioPackages = []string{"net", "os", "syscall", "io/ioutil", "log", "math/rand", "crypto/rand", "runtime/pprof", "plugin"}

// violations lists what p imports that its row does not allow.
func violations(rs rules, p goPackage) []string {
	rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
	rule, ok := rs.lookup(rel)
	if !ok {
		return []string{fmt.Sprintf("%s has no row in docs/ARCHITECTURE.md's package table: add one with what it may import", rel)}
	}
	var out []string
	bad := func(format string, args ...any) {
		out = append(out, fmt.Sprintf("%s imports %s", rel, fmt.Sprintf(format, args...))+fmt.Sprintf(", which its row in docs/ARCHITECTURE.md (%q) does not allow", rule.text))
	}
	for _, imp := range p.Imports {
		switch {
		case rule.any:
		case strings.HasPrefix(imp, module+"/"):
			if dep := strings.TrimPrefix(imp, module+"/"); !rule.allows(dep) {
				bad("%s", dep)
			}
		case external(imp):
			if rule.stdlibOnly {
				bad("%s, a module outside the standard library", imp)
			} else if len(rule.externals) > 0 && !underAny(imp, rule.externals) {
				bad("%s, an external module its row does not name", imp)
			}
		case rule.noIO && underAny(imp, ioPackages):
			bad("%s, a standard library package that does I/O (the row says no I/O)", imp)
		}
	}
	return out
}

// external reports whether an import path is outside the standard library
// (its first element has a dot) and outside the module.
func external(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return strings.Contains(first, ".") && !strings.HasPrefix(path, module+"/") && path != module
}

// underAny reports whether path is one of roots or below one.
func underAny(path string, roots []string) bool {
	for _, r := range roots {
		if path == r || strings.HasPrefix(path, r+"/") {
			return true
		}
	}
	return false
}

// The check fails on what the table forbids: a stdlib-only, no-I/O package
// (the deterministic core) importing net/http or hashicorp/raft; a row with
// named external modules importing another one; a module edge the row does
// not list.
func TestViolationsAreFound(t *testing.T) {
	rs, err := parseRows([]string{
		"| `fsm` | x | internal/binread, stdlib only, no I/O |",
		"| `internal/hftok` | x | stdlib, golang.org/x/text |",
		"| `cluster` | x | fsm |",
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pkg, imp string
		want     string // "" for allowed
	}{
		{"fsm", "net/http", "net/http, a standard library package that does I/O"},
		{"fsm", "os", "os, a standard library package that does I/O"},
		{"fsm", "github.com/hashicorp/raft", "github.com/hashicorp/raft, a module outside the standard library"},
		{"fsm", "crypto/sha256", ""},
		{"fsm", module + "/internal/binread", ""},
		{"fsm", module + "/cluster", "fsm imports cluster, which"},
		{"internal/hftok", "golang.org/x/text/unicode/norm", ""},
		{"internal/hftok", "golang.org/x/net/html", "golang.org/x/net/html, an external module its row does not name"},
		{"internal/hftok", "net/http", ""},
		{"cluster", "github.com/hashicorp/raft", ""},
	} {
		got := violations(rs, goPackage{ImportPath: module + "/" + c.pkg, Imports: []string{c.imp}})
		switch {
		case c.want == "" && len(got) != 0:
			t.Errorf("%s → %s: refused: %v", c.pkg, c.imp, got)
		case c.want != "" && (len(got) != 1 || !strings.Contains(got[0], c.want)):
			t.Errorf("%s → %s: %v, want a violation containing %q", c.pkg, c.imp, got, c.want)
		}
	}
}

// Inside edge/ the imports also run one way: docs/ARCHITECTURE.md lists
// edge/'s packages in layers, top to bottom ("Layers inside edge/"), and a
// package there may import, of edge/'s packages, only those of a lower
// layer. Every package of edge/ needs a layer.
func TestEdgeImportsRunDownItsLayers(t *testing.T) {
	root := repo.Root(t)
	layers, err := parseLayers(filepath.Join(root, "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range listPackages(t, root, "./edge/...") {
		for _, v := range layerViolations(layers, p) {
			t.Error(v)
		}
	}
}

// The layers check fails on an upward import inside edge/ and on one
// between two packages of the same layer; a downward one, or one outside
// edge/, passes.
func TestUpwardEdgeImportIsFound(t *testing.T) {
	layers, err := parseLayerLines([]string{"edge", "edge/dispatch", "edge/route edge/stored", "edge/api"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pkg, imp string
		want     string // "" for allowed
	}{
		{"edge/api", module + "/edge/route", "edge/api imports edge/route, which is not in a layer below edge/api's"},
		{"edge/route", module + "/edge/stored", "edge/route imports edge/stored, which is not in a layer below"},
		{"edge/route", module + "/edge/api", ""},
		{"edge", module + "/edge/dispatch", ""},
		{"edge/dispatch", module + "/fsm", ""},
		{"edge/dispatch", module + "/edge/tokenize", "edge/tokenize has no layer"},
	} {
		got := layerViolations(layers, goPackage{ImportPath: module + "/" + c.pkg, Imports: []string{c.imp}})
		switch {
		case c.want == "" && len(got) != 0:
			t.Errorf("%s → %s: refused: %v", c.pkg, c.imp, got)
		case c.want != "" && (len(got) != 1 || !strings.Contains(got[0], c.want)):
			t.Errorf("%s → %s: %v, want a violation containing %q", c.pkg, c.imp, got, c.want)
		}
	}
	if v := layerViolations(layers, goPackage{ImportPath: module + "/edge/newpart"}); len(v) != 1 || !strings.Contains(v[0], "edge/newpart has no layer") {
		t.Errorf("a package of edge/ without a layer: %v", v)
	}
}

// layers maps each package of edge/ to its layer (0: the top).
type layers map[string]int

// layerViolations lists p's imports inside edge/ that do not run down the
// layers.
func layerViolations(ls layers, p goPackage) []string {
	rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
	if rel != "edge" && !strings.HasPrefix(rel, "edge/") {
		return nil
	}
	at, ok := ls[rel]
	if !ok {
		return []string{fmt.Sprintf("%s has no layer in docs/ARCHITECTURE.md's \"Layers inside edge/\": add it to the one it belongs to", rel)}
	}
	var out []string
	for _, imp := range p.Imports {
		dep, ok := strings.CutPrefix(imp, module+"/")
		if !ok || (dep != "edge" && !strings.HasPrefix(dep, "edge/")) {
			continue
		}
		switch l, ok := ls[dep]; {
		case !ok:
			out = append(out, fmt.Sprintf("%s imports %s, and %s has no layer in docs/ARCHITECTURE.md's \"Layers inside edge/\"", rel, dep, dep))
		case l <= at:
			out = append(out, fmt.Sprintf("%s imports %s, which is not in a layer below %s's (docs/ARCHITECTURE.md, \"Layers inside edge/\"): imports inside edge/ run down the layers", rel, dep, rel))
		}
	}
	return out
}

// parseLayers reads the fenced block under "### Layers inside edge/": one
// layer a line, top first, its packages separated by spaces.
func parseLayers(path string) (layers, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var lines []string
	in, fenced := false, false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "### Layers inside edge/"):
			in = true
		case in && strings.HasPrefix(line, "```") && fenced:
			return parseLayerLines(lines)
		case in && strings.HasPrefix(line, "```"):
			fenced = true
		case in && fenced:
			lines = append(lines, line)
		}
	}
	return nil, fmt.Errorf("%s: no fenced block under \"### Layers inside edge/\"", path)
}

func parseLayerLines(lines []string) (layers, error) {
	ls := layers{}
	for i, line := range lines {
		for _, pkg := range strings.Fields(line) {
			if _, dup := ls[pkg]; dup {
				return nil, fmt.Errorf("edge/ layers: %s is in two layers", pkg)
			}
			ls[pkg] = i
		}
	}
	return ls, nil
}

func TestBinaryDoesNotLinkReportPlots(t *testing.T) {
	root := repo.Root(t)
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
	text       string
	any        bool
	exact      map[string]bool
	prefixes   []string // "x/" for x/* and x (+ subpackages)
	stdlibOnly bool     // "stdlib only": no module outside the standard library
	noIO       bool     // "no I/O": none of ioPackages
	externals  []string // external modules the row names (then only those)
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

// parseAllowed reads a "may import" cell: comma-separated items, where "x/*"
// is every package below x, "x (+ subpackages)" is x and every package below
// it, other parenthesised text is a comment, a path whose first element has
// a dot is an external module, "stdlib only" and "no I/O" restrict the
// rest (see the package comment), "stdlib" and "—" name nothing, and
// "everything" allows all.
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
		case item == "stdlib only":
			r.stdlibOnly = true
		case item == "no I/O":
			r.noIO = true
		case external(item):
			r.externals = append(r.externals, item)
		case item == "" || item == "—" || strings.HasPrefix(item, "stdlib"):
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
