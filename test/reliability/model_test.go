package reliability

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// The sequential specification the affinity log must be linearizable to,
// per routing key: "the first committed binding wins, then stays until
// evicted". State is the bound instance ("" = unbound).
//
//	Bind(key, inst)  → the winner (inst when the key was unbound)
//	Lookup(key)      → the binding or none
//	Evict(key)       → evicted (it was bound) or not bound
//
// Outcomes a client cannot know are modelled explicitly:
//   - an operation that failed (timeout, no quorum, node killed) may still
//     take effect at any later time: its return time is "never" and it may
//     or may not have applied;
//   - a proposal the cluster retried internally and found already applied
//     (fsm.StatusDuplicate) took effect exactly once, but the result it
//     carries is the state at the retry, so only its effect is modelled.
//
// Every Bind names a fresh instance, so a winner identifies the operation
// that created the binding.

type opKind uint8

const (
	opBind opKind = iota + 1
	opLookup
	opEvict
)

type opInput struct {
	kind opKind
	key  string
	inst string // Bind only
}

type outcome uint8

const (
	outOK         outcome = iota + 1 // the result is known: value / evicted hold
	outApplied                       // took effect once, result not known
	outIndefinite                    // may or may not have taken effect
)

type opOutput struct {
	outcome outcome
	value   string // Bind: winner; Lookup: bound instance ("" = none)
	evicted bool   // Evict: true when it removed a binding
}

var bindingModel = (&porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(opInput).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []interface{} { return []interface{}{""} },
	Step: func(state, input, output interface{}) []interface{} {
		bound := state.(string)
		in, out := input.(opInput), output.(opOutput)
		switch in.kind {
		case opBind:
			winner := bound
			if bound == "" {
				winner = in.inst
			}
			switch out.outcome {
			case outOK:
				if out.value != winner {
					return nil
				}
				return []interface{}{winner}
			case outApplied:
				return []interface{}{winner}
			default:
				return []interface{}{bound, winner}
			}
		case opLookup:
			if out.outcome == outOK && out.value != bound {
				return nil
			}
			return []interface{}{bound}
		case opEvict:
			if out.value != "" {
				return nil // an impossible status was recorded
			}
			switch out.outcome {
			case outOK:
				if out.evicted != (bound != "") {
					return nil
				}
				return []interface{}{""}
			case outApplied:
				return []interface{}{""}
			default:
				return []interface{}{bound, ""}
			}
		}
		return nil
	},
	Equal: func(a, b interface{}) bool { return a.(string) == b.(string) },
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(opInput), output.(opOutput)
		res := map[outcome]string{outOK: "", outApplied: " (applied, result unknown)", outIndefinite: " (indefinite)"}[out.outcome]
		switch in.kind {
		case opBind:
			return fmt.Sprintf("Bind(%s, %s) → %q%s", in.key, in.inst, out.value, res)
		case opLookup:
			return fmt.Sprintf("Lookup(%s) → %q%s", in.key, out.value, res)
		default:
			return fmt.Sprintf("Evict(%s) → evicted=%v%s", in.key, out.evicted, res)
		}
	},
	DescribeState: func(s interface{}) string { return fmt.Sprintf("%q", s) },
}).ToModel()

// history records client operations with monotonic timestamps.
type history struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
}

func newHistory() *history { return &history{start: time.Now()} }

func (h *history) now() int64 { return int64(time.Since(h.start)) }

// add records one completed operation; indefinite ones never return.
func (h *history) add(client int, in opInput, call int64, out opOutput) {
	ret := h.now()
	if out.outcome == outIndefinite {
		ret = math.MaxInt64
	}
	h.mu.Lock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
	h.mu.Unlock()
}

func (h *history) operations() []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]porcupine.Operation(nil), h.ops...)
}

// describe prints one key's operations in call order, for a failure report.
func describeKey(ops []porcupine.Operation, key string) string {
	var sel []porcupine.Operation
	for _, op := range ops {
		if op.Input.(opInput).key == key {
			sel = append(sel, op)
		}
	}
	sort.Slice(sel, func(i, j int) bool { return sel[i].Call < sel[j].Call })
	var b strings.Builder
	for _, op := range sel {
		ret := "never"
		if op.Return != math.MaxInt64 {
			ret = time.Duration(op.Return).String()
		}
		fmt.Fprintf(&b, "  c%d [%s, %s] %s\n", op.ClientId, time.Duration(op.Call), ret, bindingModel.DescribeOperation(op.Input, op.Output))
	}
	return b.String()
}
