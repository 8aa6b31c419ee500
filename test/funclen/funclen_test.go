// Package funclen keeps the repository's functions short: no function of a
// non-test Go file may span more than MaxLines lines (from "func" to its
// closing brace). A longer one is split into named steps, as cluster.Open
// is. The few still over it are listed in pending, each to be split by the
// change that is rewriting it; the list only shrinks: a new long function
// fails, and so does an entry that is no longer long (remove it).
package funclen

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/tether-project/tether/test/repo"
)

// MaxLines is the longest a function may be.
const MaxLines = 80

// pending are the functions over MaxLines that a change in progress
// rewrites ("path:Func" or "path:Type.Method").
var pending = map[string]bool{}

func TestNoLongFunctions(t *testing.T) {
	root := repo.Root(t)
	long := longFunctions(t, root, root, MaxLines)
	var names []string
	for name := range long {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !pending[name] {
			t.Errorf("%s is %d lines (the limit is %d): split it into named steps", name, long[name], MaxLines)
		}
	}
	for name := range pending {
		if _, ok := long[name]; !ok {
			t.Errorf("%s is no longer over %d lines: remove it from pending", name, MaxLines)
		}
	}
}

// longFunctions maps every function over max lines in the non-test Go
// files below dir to its length, named by its path from root.
func longFunctions(t *testing.T, root, dir string, max int) map[string]int {
	out := map[string]int{}
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != dir && (n == "node_modules" || n == "testdata" || strings.HasPrefix(n, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fs := token.NewFileSet()
		f, err := parser.ParseFile(fs, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		rel, _ := filepath.Rel(root, path)
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			if n := fs.Position(fd.End()).Line - fs.Position(fd.Pos()).Line + 1; n > max {
				out[filepath.ToSlash(rel)+":"+funcName(fd)] = n
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	switch x := typ.(type) {
	case *ast.IndexExpr:
		typ = x.X
	case *ast.IndexListExpr:
		typ = x.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}
