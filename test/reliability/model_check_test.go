package reliability

import (
	"math"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// The checker must be able to fail: these hand-written histories pin the
// model's meaning.
func TestBindingModelAcceptsAndRejects(t *testing.T) {
	op := func(c int, in opInput, call, ret int64, out opOutput) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret}
	}
	bind := func(k, inst string) opInput { return opInput{kind: opBind, key: k, inst: inst} }
	look := opInput{kind: opLookup, key: "k"}
	evict := opInput{kind: opEvict, key: "k"}
	ok := func(v string) opOutput { return opOutput{outcome: outOK, value: v} }
	never := int64(math.MaxInt64)
	cases := []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"first bind wins, second sees it", []porcupine.Operation{
			op(0, bind("k", "a"), 0, 10, ok("a")),
			op(1, bind("k", "b"), 20, 30, ok("a")),
		}, porcupine.Ok},
		{"two winners is illegal", []porcupine.Operation{
			op(0, bind("k", "a"), 0, 10, ok("a")),
			op(1, bind("k", "b"), 20, 30, ok("b")),
		}, porcupine.Illegal},
		{"an acknowledged binding cannot vanish", []porcupine.Operation{
			op(0, bind("k", "a"), 0, 10, ok("a")),
			op(1, look, 20, 30, ok("")),
		}, porcupine.Illegal},
		{"evict then rebind", []porcupine.Operation{
			op(0, bind("k", "a"), 0, 10, ok("a")),
			op(1, evict, 20, 30, opOutput{outcome: outOK, evicted: true}),
			op(1, bind("k", "b"), 40, 50, ok("b")),
			op(0, look, 60, 70, ok("b")),
		}, porcupine.Ok},
		{"evict of an unbound key cannot report evicted", []porcupine.Operation{
			op(1, evict, 20, 30, opOutput{outcome: outOK, evicted: true}),
		}, porcupine.Illegal},
		{"an indefinite bind may take effect later", []porcupine.Operation{
			op(0, bind("k", "a"), 0, never, opOutput{outcome: outIndefinite}),
			op(1, look, 20, 30, ok("")),
			op(1, look, 40, 50, ok("a")),
		}, porcupine.Ok},
		{"an indefinite bind cannot un-happen", []porcupine.Operation{
			op(0, bind("k", "a"), 0, never, opOutput{outcome: outIndefinite}),
			op(1, look, 20, 30, ok("a")),
			op(1, look, 40, 50, ok("")),
		}, porcupine.Illegal},
		{"a read cannot see an instance nobody bound", []porcupine.Operation{
			op(1, look, 20, 30, ok("ghost")),
		}, porcupine.Illegal},
		{"an applied evict leaves the key unbound", []porcupine.Operation{
			op(0, bind("k", "a"), 0, 10, ok("a")),
			op(1, evict, 20, 30, opOutput{outcome: outApplied}),
			op(1, look, 40, 50, ok("a")),
		}, porcupine.Illegal},
	}
	for _, c := range cases {
		if got := porcupine.CheckOperationsTimeout(bindingModel, c.ops, 5*time.Second); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
