package main

import (
	"reflect"
	"regexp"
	"testing"
	"time"

	"github.com/tether-project/tether/ops/audit"
	"github.com/tether-project/tether/ops/bench"
	"github.com/tether-project/tether/ops/operator"
	"github.com/tether-project/tether/ops/tune"
)

var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// checkJSONNames walks t and reports every exported struct field whose JSON
// name is not snake_case (an untagged field is encoded under its Go name).
func checkJSONNames(t *testing.T, typ reflect.Type, path string, seen map[reflect.Type]bool) {
	t.Helper()
	for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice || typ.Kind() == reflect.Array || typ.Kind() == reflect.Map {
		typ = typ.Elem()
	}
	if typ.Kind() != reflect.Struct || seen[typ] || typ == reflect.TypeFor[time.Time]() {
		return
	}
	seen[typ] = true
	for i := range typ.NumField() {
		f := typ.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		name, _, _ := cut(tag)
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			checkJSONNames(t, f.Type, path, seen)
			continue
		}
		if name == "" {
			name = f.Name
		}
		if !snakeCase.MatchString(name) {
			t.Errorf("%s.%s (%s): JSON name %q is not snake_case", path, f.Name, typ, name)
		}
		checkJSONNames(t, f.Type, path+"."+name, seen)
	}
}

func cut(tag string) (string, string, bool) {
	for i := range len(tag) {
		if tag[i] == ',' {
			return tag[:i], tag[i+1:], true
		}
	}
	return tag, "", false
}

// Every type a --json flag prints names its fields in snake_case, as the
// admin API does.
func TestJSONOutputIsSnakeCase(t *testing.T) {
	for _, v := range []any{
		operator.PeerList{}, operator.MembershipResult{}, operator.SnapshotFileInfo{}, operator.RestoreResult{},
		operator.InstanceList{}, operator.DrainResult{},
		operator.SnapshotReport{}, audit.Explanation{}, audit.Summary{}, audit.OutcomeMismatch{},
		bench.Report{}, bench.E2EComparison{}, bench.AgentsReport{},
		audit.AccuracyReport{}, tune.Report{},
	} {
		typ := reflect.TypeOf(v)
		checkJSONNames(t, typ, typ.Name(), map[reflect.Type]bool{})
	}
}
