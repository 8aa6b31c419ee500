package imports

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/tether-project/tether/test/repo"
)

// The routing decision is one package over mechanisms below it
// (routing/DESIGN.md, "The shape"). These tests hold that shape: imports
// inside routing/ run down, the deterministic core (fsm, routing) does no
// I/O and reads no clock, and within routing a file calls only its own
// layer or the layers below it.

// routingLayers are the layers of the routing package's files, top first. A
// function may call functions of its own layer or of a layer below it.
var routingLayers = [][]string{
	{"doc.go", "decide.go", "identity.go", "clientagents.go"}, // the entry points and the walk
	{"stay.go"},             // stay or move
	{"place.go", "lora.go"}, // which instance
	{"router.go", "decider.go", "views.go", "config.go"}, // the types every layer reads
}

// deterministicCore are the packages (with those below them) that do no
// I/O and read no clock.
var deterministicCore = []string{"fsm", "routing"}

// upwardImports lists the imports of pkg (a module-relative path) that name
// one of its ancestors inside root: a package below root importing a
// package above it.
func upwardImports(root, pkg string, imports []string) []string {
	if pkg != root && !strings.HasPrefix(pkg, root+"/") {
		return nil
	}
	var out []string
	for _, imp := range imports {
		dep, ok := strings.CutPrefix(imp, module+"/")
		if !ok || dep == pkg {
			continue
		}
		if strings.HasPrefix(pkg, dep+"/") && (dep == root || strings.HasPrefix(dep, root+"/")) {
			out = append(out, fmt.Sprintf("%s imports %s, a package above it", pkg, dep))
		}
	}
	return out
}

func TestNoUpwardImportInsideRouting(t *testing.T) {
	root := repo.Root(t)
	for _, p := range listPackages(t, root, "./routing/...") {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		for _, v := range upwardImports("routing", rel, p.Imports) {
			t.Error(v)
		}
	}
}

// An import up inside routing/ fails twice: the structural check above, and
// the package table, whose rows for the mechanisms do not name routing.
func TestUpwardImportInsideRoutingIsRefused(t *testing.T) {
	if got := upwardImports("routing", "routing/kvindex", []string{module + "/routing", module + "/fsm"}); len(got) != 1 ||
		!strings.Contains(got[0], "routing/kvindex imports routing") {
		t.Errorf("routing/kvindex → routing: %v, want one upward import", got)
	}
	if got := upwardImports("routing", "routing", []string{module + "/routing/kvindex"}); len(got) != 0 {
		t.Errorf("routing → routing/kvindex is downward: %v", got)
	}
	root := repo.Root(t)
	rules, err := parseTable(filepath.Join(root, "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range listPackages(t, root, "./routing/...") {
		if p.ImportPath == module+"/routing" {
			continue
		}
		n++
		got := violations(rules, goPackage{ImportPath: p.ImportPath, Imports: []string{module + "/routing"}})
		if len(got) != 1 || !strings.Contains(got[0], "imports routing, which its row") {
			t.Errorf("%s → routing: the table allows it (%v); the mechanisms' rows must not name routing", p.ImportPath, got)
		}
	}
	if n < 4 {
		t.Fatalf("%d packages below routing, want at least kvindex, breaker, overload, rendezvous", n)
	}
}

// The rows of the deterministic core say "no I/O", so an I/O import fails
// TestImportsFollowArchitectureTable; a row edited to drop it fails here.
func TestDeterministicCoreRowsRefuseIO(t *testing.T) {
	root := repo.Root(t)
	rules, err := parseTable(filepath.Join(root, "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, core := range deterministicCore {
		for _, p := range listPackages(t, root, "./"+core+"/...") {
			rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
			for _, imp := range []string{"net/http", "os", "math/rand", "crypto/rand"} {
				if got := violations(rules, goPackage{ImportPath: p.ImportPath, Imports: []string{imp}}); len(got) != 1 {
					t.Errorf("%s may import %s by its row in docs/ARCHITECTURE.md: the deterministic core's rows say no I/O", rel, imp)
				}
			}
		}
	}
}

// clockCalls are the functions of package time that read or wait on the
// clock.
var clockCalls = map[string]bool{
	"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true, "Tick": true,
	"NewTimer": true, "NewTicker": true, "AfterFunc": true,
}

// clockReads lists the uses of the clock in one Go source file.
func clockReads(fs *token.FileSet, name string, src any) ([]string, error) {
	f, err := parser.ParseFile(fs, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	timeName := ""
	for _, imp := range f.Imports {
		if imp.Path.Value == `"time"` {
			timeName = "time"
			if imp.Name != nil {
				timeName = imp.Name.Name
			}
		}
	}
	if timeName == "" {
		return nil, nil
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); ok && x.Name == timeName && clockCalls[sel.Sel.Name] {
			out = append(out, fmt.Sprintf("%s: time.%s", fs.Position(sel.Pos()), sel.Sel.Name))
		}
		return true
	})
	return out, nil
}

func TestDeterministicCoreReadsNoClock(t *testing.T) {
	root := repo.Root(t)
	fs := token.NewFileSet()
	for _, core := range deterministicCore {
		err := filepath.WalkDir(filepath.Join(root, core), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			reads, err := clockReads(fs, path, nil)
			for _, r := range reads {
				t.Errorf("%s: the deterministic core reads no clock (time is a parameter)", r)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	src := "package x\nimport clock \"time\"\nfunc f() { _ = clock.Now(); var d clock.Duration; _ = d }\n"
	if got, err := clockReads(fs, "x.go", src); err != nil || len(got) != 1 || !strings.Contains(got[0], "time.Now") {
		t.Fatalf("clock read under another import name: %v %v, want one time.Now", got, err)
	}
}

// upwardCalls type-checks one package's files and lists the calls from a
// function of one file to a function or method declared in a file of a
// higher layer. Every file must be in a layer.
func upwardCalls(fs *token.FileSet, files []*ast.File, layers [][]string, imp types.Importer) ([]string, error) {
	layerOf := map[string]int{}
	for i, l := range layers {
		for _, name := range l {
			layerOf[name] = i
		}
	}
	for _, f := range files {
		if _, ok := layerOf[filepath.Base(fs.Position(f.Pos()).Filename)]; !ok {
			return nil, fmt.Errorf("%s is in no layer: add it to routingLayers (and to routing/DESIGN.md's drawing)", fs.Position(f.Pos()).Filename)
		}
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: imp}
	pkg, err := conf.Check("layers", fs, files, info)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range files {
		from := filepath.Base(fs.Position(f.Pos()).Filename)
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			var id *ast.Ident
			switch fn := ast.Unparen(call.Fun).(type) {
			case *ast.Ident:
				id = fn
			case *ast.SelectorExpr:
				id = fn.Sel
			}
			if id == nil {
				return true
			}
			obj, ok := info.Uses[id].(*types.Func)
			if !ok || obj.Pkg() != pkg {
				return true
			}
			to := filepath.Base(fs.Position(obj.Pos()).Filename)
			if layerOf[to] < layerOf[from] {
				out = append(out, fmt.Sprintf("%s calls %s of %s, a layer above it", fs.Position(call.Pos()), obj.Name(), to))
			}
			return true
		})
	}
	sort.Strings(out)
	return out, nil
}

// TestRoutingWalksDown: within the routing package a request's walk goes
// down the layers of its files (routingLayers), never back up.
func TestRoutingWalksDown(t *testing.T) {
	root := repo.Root(t)
	dir := filepath.Join(root, "routing")
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fs := token.NewFileSet()
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fs, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	calls, err := upwardCalls(fs, files, routingLayers, exportImporter(t, root, fs, "./routing"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range calls {
		t.Error(c)
	}
}

func TestUpwardCallIsFound(t *testing.T) {
	fs := token.NewFileSet()
	var files []*ast.File
	for name, src := range map[string]string{
		"decide.go": "package routing\nfunc Decide() int { return place() }\nfunc keyed() int { return 1 }\n",
		"place.go":  "package routing\nfunc place() int { return keyed() + size(nil) }\n",
		"router.go": "package routing\ntype views struct{}\nfunc size(v *views) int { return 0 }\n",
	} {
		f, err := parser.ParseFile(fs, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	layers := [][]string{{"decide.go"}, {"place.go"}, {"router.go"}}
	got, err := upwardCalls(fs, files, layers, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !strings.Contains(got[0], "calls keyed of decide.go, a layer above it") {
		t.Fatalf("upward calls %v, want place.go's call of keyed only", got)
	}
	if _, err := upwardCalls(fs, files, [][]string{{"decide.go"}, {"place.go"}}, nil); err == nil ||
		!strings.Contains(err.Error(), "router.go is in no layer") {
		t.Fatalf("a file in no layer: %v", err)
	}
}

// exportImporter imports the dependencies of pattern from the compiler's
// export data, as go list -export builds it.
func exportImporter(t *testing.T, root string, fs *token.FileSet, pattern string) types.Importer {
	t.Helper()
	cmd := exec.Command("go", "list", "-export", "-deps", "-json=ImportPath,Export", pattern)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export %s: %v\n%s", pattern, err, stderr.String())
	}
	exports := map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct{ ImportPath, Export string }
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go list -export %s: %v", pattern, err)
		}
		exports[p.ImportPath] = p.Export
	}
	return importer.ForCompiler(fs, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok || file == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
}
