package sim

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tether-project/tether/worker/engine"
)

func TestSchemaInstanceSatisfiesCommonSchemas(t *testing.T) {
	cases := []struct{ schema, want string }{
		{``, `{}`},
		{`{}`, `{}`},
		{`{"type":"object","properties":{"a":{"type":"string"}}}`, `{}`},
		{`{"type":"object","properties":{"n":{"type":"integer","minimum":2.5},"b":{"type":"boolean"}},"required":["n","b"]}`, `{"n":3,"b":false}`},
		{`{"type":"object","properties":{"x":{"type":["null","integer"],"exclusiveMinimum":4}},"required":["x"]}`, `{"x":5}`},
		{`{"type":"array","items":{"const":"k"},"minItems":3}`, `["k","k","k"]`},
		{`{"type":"array","items":{"type":"integer"},"maxItems":0}`, `[]`},
		{`{"$ref":"#/definitions/a","definitions":{"a":{"type":"object","required":["self"],"properties":{"self":{"$ref":"#/definitions/a"}}}}}`, ``},
		{`{"allOf":[{"type":"object","properties":{"a":{"enum":[1,2]}},"required":["a"]},{"properties":{"b":{"type":"null"}},"required":["b"]}]}`, `{"a":1,"b":null}`},
		{`{"type":"string","format":"date-time"}`, `"2026-01-01T00:00:00Z"`},
		{`{"type":"string","maxLength":2}`, ``},
	}
	for _, tc := range cases {
		got := schemaInstance([]byte(tc.schema), 42)
		if !json.Valid([]byte(got)) {
			t.Fatalf("schema %s: invalid JSON %s", tc.schema, got)
		}
		if tc.want != "" && got != tc.want {
			t.Fatalf("schema %s: got %s, want %s", tc.schema, got, tc.want)
		}
	}
	if got := schemaInstance([]byte(`{"type":"string","maxLength":2}`), 42); len(got) > 4 {
		t.Fatalf("maxLength 2: %s", got)
	}
}

func TestPlanHonoursStopAndToolLimit(t *testing.T) {
	full := outputText(7, 10)
	w := strings.Fields(full)[2]
	p := planOutput(7, 10, &engine.OutputOptions{Stop: []string{w}})
	if p.finish != "stop" || p.text != full[:strings.Index(full, w)] {
		t.Fatalf("stop %q in %q: %q %s", w, full, p.text, p.finish)
	}
	var cat strings.Builder
	for _, c := range p.chunks {
		cat.WriteString(c.Text)
	}
	if cat.String() != p.text {
		t.Fatalf("chunks %q do not add up to %q", cat.String(), p.text)
	}
	tools := []engine.Tool{{Name: "a", Parameters: []byte(`{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}`)}}
	p = planOutput(7, 2, &engine.OutputOptions{Tools: tools, ParallelToolCalls: true, ToolChoice: "required"})
	if p.finish != "length" || len(p.chunks) != 2 || len(p.calls) != 1 {
		t.Fatalf("max 2 tokens: %+v", p)
	}
	p = planOutput(7, 4096, &engine.OutputOptions{Tools: tools, ParallelToolCalls: true, ToolChoice: "required"})
	if p.finish != "tool_calls" || !json.Valid([]byte(p.calls[0].Arguments)) {
		t.Fatalf("max 4096 tokens: %+v", p)
	}
}
