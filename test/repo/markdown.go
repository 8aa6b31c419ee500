package repo

import "strings"

// Block is one fenced block of a Markdown document: its text and the line
// its first line of text is on (1-based).
type Block struct {
	Text string
	Line int
}

// YAMLBlocks are the ```yaml fenced blocks of a Markdown document, for
// tests that check the configuration examples a document shows.
func YAMLBlocks(doc string) []Block {
	var out []Block
	var cur *strings.Builder
	start := 0
	for i, line := range strings.Split(doc, "\n") {
		switch {
		case cur == nil && strings.TrimSpace(line) == "```yaml":
			cur, start = &strings.Builder{}, i+2
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, Block{cur.String(), start})
			cur = nil
		case cur != nil:
			cur.WriteString(line)
			cur.WriteByte('\n')
		}
	}
	return out
}
