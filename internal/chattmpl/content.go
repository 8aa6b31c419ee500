package chattmpl

import (
	"regexp"

	"github.com/nikolalohinski/gonja/v2/exec"
)

var (
	// messagesLoop finds `{% for <var> in messages ... %}` (also over a
	// slice or a filtered messages) and `{% set <var> = messages ... %}`.
	messagesLoop = regexp.MustCompile(`\{%-?\s*(?:for\s+(\w+)\s+in|set\s+(\w+)\s*=)\s*(\w+)`)
	// contentLoop finds `{% for <part> in <var>.content` or
	// `<var>['content']` / `<var>["content"]`.
	contentLoop = regexp.MustCompile(`\{%-?\s*for\s+\w+\s+in\s+(\w+)\s*(?:\.content\b|\[\s*['"]content['"]\s*\])`)
)

// iteratesContent tells whether a template loops over a message's content
// parts, which vLLM detects on the template's syntax tree to hand such
// templates content as a list of parts (its "openai" content format)
// rather than a string. This is the same test on the template's text: a
// loop over `<m>.content` where <m> is a loop variable over the messages
// (or over a variable set from them).
func iteratesContent(source string) bool {
	vars := map[string]bool{"messages": true}
	// Variables assigned from messages (loop_messages = messages[1:]),
	// then loop variables over any of them; two passes cover the order.
	for range 2 {
		for _, m := range messagesLoop.FindAllStringSubmatch(source, -1) {
			if vars[m[3]] {
				if m[1] != "" {
					vars[m[1]] = true
				} else {
					vars[m[2]] = true
				}
			}
		}
	}
	for _, m := range contentLoop.FindAllStringSubmatch(source, -1) {
		if vars[m[1]] && m[1] != "messages" {
			return true
		}
	}
	return false
}

// textParts is content as vLLM hands it to a template of the "openai"
// content format: a string is one text part, text parts stay text parts
// ({"type": "text", "text": ...}), absent or null content is no part.
func textParts(c any) []any {
	switch x := c.(type) {
	case string:
		return []any{textPart(x)}
	case []any:
		out := make([]any, 0, len(x))
		for _, p := range x {
			part, _ := p.(exec.Dict)
			t, _ := dictGet(part, "text")
			s, _ := t.(string)
			out = append(out, textPart(s)) // flattenContent already checked the parts
		}
		return out
	}
	return []any{}
}

func textPart(s string) exec.Dict {
	d := exec.Dict{Pairs: []*exec.Pair{}}
	setPair(&d, "type", "text")
	setPair(&d, "text", s)
	return d
}
