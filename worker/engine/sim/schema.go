package sim

import (
	"bytes"
	"encoding/json"
	"math"
	"sort"
	"strconv"
	"strings"
)

// maxSchemaDepth bounds nesting and $ref chains (recursive schemas): deeper
// values are null, or the shortest value the schema allows.
const maxSchemaDepth = 32

// schemaInstance returns compact JSON satisfying the JSON schema raw (a
// minimal instance: required properties only, minItems items but at least
// one, the first enum value or anyOf branch). An empty or invalid schema
// gives {} (tool arguments are an object). Strings are words of the
// vocabulary chosen by seed; formats date-time, date, time, email, uri and
// uuid get fixed valid values; pattern is not honoured.
func schemaInstance(raw []byte, seed uint64) string {
	doc, _ := argumentsInstance(raw, seed, nil)
	return doc
}

// argumentsInstance is schemaInstance whose top-level object takes fill's
// strings, in order, as the values of its required string properties
// (those without enum or const), in required order; used is how many it
// took.
func argumentsInstance(raw []byte, seed uint64, fill []string) (doc string, used int) {
	var root any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if len(bytes.TrimSpace(raw)) == 0 || d.Decode(&root) != nil {
		return "{}", 0
	}
	if m, ok := root.(map[string]any); ok && len(m) == 0 {
		return "{}", 0
	}
	g := &schemaGen{root: root, seed: seed, fill: fill, top: true}
	var b strings.Builder
	g.write(&b, root, 0)
	return b.String(), g.used
}

type schemaGen struct {
	root  any
	seed  uint64
	words int
	// fill are the strings the top-level object's required string
	// properties take; top is true until that object is written.
	fill []string
	used int
	top  bool
}

func (g *schemaGen) word() string {
	w := outputWord(g.seed, g.words)
	g.words++
	return w
}

// resolve follows a local $ref ("#/$defs/x", "#/definitions/x", "#").
func (g *schemaGen) resolve(ref string) any {
	if !strings.HasPrefix(ref, "#") {
		return nil
	}
	cur := g.root
	for _, part := range strings.Split(strings.TrimPrefix(ref, "#"), "/") {
		if part == "" {
			continue
		}
		part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[part]
	}
	return cur
}

func (g *schemaGen) write(b *strings.Builder, s any, depth int) {
	m, ok := s.(map[string]any)
	if !ok || depth > maxSchemaDepth {
		b.WriteString("null")
		return
	}
	if ref, ok := m["$ref"].(string); ok {
		g.write(b, g.resolve(ref), depth+1)
		return
	}
	if c, ok := m["const"]; ok {
		writeValue(b, c)
		return
	}
	if e, ok := m["enum"].([]any); ok && len(e) > 0 {
		writeValue(b, e[0])
		return
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if alts, ok := m[k].([]any); ok && len(alts) > 0 {
			g.write(b, pickBranch(alts), depth+1)
			return
		}
	}
	if all, ok := m["allOf"].([]any); ok && len(all) > 0 {
		g.write(b, mergeAll(m, all), depth+1)
		return
	}
	switch schemaType(m) {
	case "object":
		g.writeObject(b, m, depth)
	case "array":
		g.writeArray(b, m, depth)
	case "string":
		writeValue(b, g.stringValue(m))
	case "integer":
		b.WriteString(strconv.FormatInt(intValue(m), 10))
	case "number":
		b.WriteString(strconv.FormatFloat(numberValue(m), 'g', -1, 64))
	case "boolean":
		b.WriteString("false")
	default:
		b.WriteString("null")
	}
}

// schemaType is the schema's type: the first non-null of a type list, else
// inferred from the keywords present.
func schemaType(m map[string]any) string {
	switch t := m["type"].(type) {
	case string:
		return t
	case []any:
		for _, v := range t {
			if s, ok := v.(string); ok && s != "null" {
				return s
			}
		}
		return "null"
	}
	switch {
	case m["properties"] != nil || m["required"] != nil:
		return "object"
	case m["items"] != nil || m["prefixItems"] != nil:
		return "array"
	}
	return ""
}

// pickBranch prefers a branch that is not just {"type":"null"}.
func pickBranch(alts []any) any {
	for _, a := range alts {
		if m, ok := a.(map[string]any); ok && m["type"] != "null" {
			return a
		}
	}
	return alts[0]
}

// mergeAll folds allOf branches into one schema (properties, required and
// the first type win): enough for the composed objects generators emit.
func mergeAll(m map[string]any, all []any) map[string]any {
	out := map[string]any{}
	props := map[string]any{}
	var req []any
	for _, s := range append([]any{m}, all...) {
		sm, ok := s.(map[string]any)
		if !ok {
			continue
		}
		for k, v := range sm {
			switch k {
			case "allOf":
			case "properties":
				if p, ok := v.(map[string]any); ok {
					for pk, pv := range p {
						props[pk] = pv
					}
				}
			case "required":
				if r, ok := v.([]any); ok {
					req = append(req, r...)
				}
			default:
				if _, seen := out[k]; !seen {
					out[k] = v
				}
			}
		}
	}
	if len(props) > 0 {
		out["properties"] = props
	}
	if len(req) > 0 {
		out["required"] = req
	}
	return out
}

func (g *schemaGen) writeObject(b *strings.Builder, m map[string]any, depth int) {
	props, _ := m["properties"].(map[string]any)
	req, _ := m["required"].([]any)
	fillable := g.top
	g.top = false
	b.WriteByte('{')
	seen := map[string]bool{}
	n := 0
	requiresString := false
	for _, r := range req {
		name, ok := r.(string)
		if !ok || seen[name] {
			continue
		}
		seen[name] = true
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		writeValue(b, name)
		b.WriteByte(':')
		ps, ok := props[name]
		if !ok {
			ps = m["additionalProperties"]
		}
		if fillable && g.plainString(ps) {
			fillable = fillable && g.used < len(g.fill)
			requiresString = true
			if fillable {
				b.WriteString(jsonString(g.fill[g.used]))
				g.used++
				continue
			}
		}
		g.write(b, ps, depth+1)
	}
	// A tool that requires no string (Codex's spawn_agent: message or
	// items, neither required) takes the first span in its first optional
	// string property by name.
	if fillable && !requiresString && g.used < len(g.fill) {
		names := make([]string, 0, len(props))
		for name := range props {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			if seen[name] || !g.plainString(props[name]) {
				continue
			}
			if n > 0 {
				b.WriteByte(',')
			}
			writeValue(b, name)
			b.WriteByte(':')
			b.WriteString(jsonString(g.fill[g.used]))
			g.used++
			break
		}
	}
	b.WriteByte('}')
}

// plainString reports whether s (through local $refs) is a string
// schema any string satisfies as far as the simulated model honours
// schemas: type string, no enum or const.
func (g *schemaGen) plainString(s any) bool {
	for range maxSchemaDepth {
		m, ok := s.(map[string]any)
		if !ok {
			return false
		}
		ref, isRef := m["$ref"].(string)
		if !isRef {
			_, hasEnum := m["enum"]
			_, hasConst := m["const"]
			return schemaType(m) == "string" && !hasEnum && !hasConst
		}
		s = g.resolve(ref)
	}
	return false
}

func (g *schemaGen) writeArray(b *strings.Builder, m map[string]any, depth int) {
	count := max(int(numberOr(m, "minItems", 0)), 1)
	if mx, ok := m["maxItems"]; ok {
		count = min(count, int(toFloat(mx)))
	}
	prefixItems, _ := m["prefixItems"].([]any)
	count = max(count, len(prefixItems))
	if depth >= maxSchemaDepth {
		count = 0
	}
	b.WriteByte('[')
	for i := 0; i < count; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		if i < len(prefixItems) {
			g.write(b, prefixItems[i], depth+1)
		} else {
			g.write(b, m["items"], depth+1)
		}
	}
	b.WriteByte(']')
}

func (g *schemaGen) stringValue(m map[string]any) string {
	var s string
	switch m["format"] {
	case "date-time":
		s = "2026-01-01T00:00:00Z"
	case "date":
		s = "2026-01-01"
	case "time":
		s = "00:00:00Z"
	case "email":
		s = "agent@example.com"
	case "uri", "url":
		s = "https://example.com/"
	case "uuid":
		s = "00000000-0000-4000-8000-000000000000"
	default:
		s = g.word()
	}
	if minLen := int(numberOr(m, "minLength", 0)); len(s) < minLen {
		s += strings.Repeat("x", minLen-len(s))
	}
	if mx, ok := m["maxLength"]; ok {
		if n := int(toFloat(mx)); n >= 0 && len(s) > n {
			s = s[:n]
		}
	}
	return s
}

func intValue(m map[string]any) int64 {
	v := 0.0
	if x, ok := m["minimum"]; ok {
		v = math.Ceil(toFloat(x))
	} else if x, ok := m["exclusiveMinimum"]; ok {
		v = math.Floor(toFloat(x)) + 1
	} else if x, ok := m["maximum"]; ok && toFloat(x) < 0 {
		v = math.Floor(toFloat(x))
	} else if x, ok := m["exclusiveMaximum"]; ok && toFloat(x) <= 0 {
		v = math.Ceil(toFloat(x)) - 1
	}
	return int64(v)
}

func numberValue(m map[string]any) float64 {
	if x, ok := m["minimum"]; ok {
		return toFloat(x)
	}
	if x, ok := m["exclusiveMinimum"]; ok {
		return toFloat(x) + 1
	}
	if x, ok := m["maximum"]; ok && toFloat(x) < 0 {
		return toFloat(x)
	}
	if x, ok := m["exclusiveMaximum"]; ok && toFloat(x) <= 0 {
		return toFloat(x) - 1
	}
	return 0
}

func numberOr(m map[string]any, key string, def float64) float64 {
	if v, ok := m[key]; ok {
		return toFloat(v)
	}
	return def
}

func toFloat(v any) float64 {
	if n, ok := v.(json.Number); ok {
		f, err := n.Float64()
		if err == nil && !math.IsInf(f, 0) && math.Abs(f) < 1<<53 {
			return f
		}
	}
	return 0
}

// writeValue writes a const or enum value as given in the schema.
func writeValue(b *strings.Builder, v any) {
	out, err := json.Marshal(v)
	if err != nil {
		b.WriteString("null")
		return
	}
	b.Write(out)
}
