package edge

import (
	"os"
	"strings"
	"testing"
)

// Every YAML block of docs/engines.md is a configuration the edge's
// decoder accepts, and the blocks cover every engine kind.
func TestEnginesDocExamplesParse(t *testing.T) {
	for _, env := range []string{EnvInternalRequestAuthKey, EnvAdminToken, EnvClusterAuthKey} {
		t.Setenv(env, "")
	}
	doc, err := os.ReadFile("../docs/engines.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := yamlBlocks(string(doc))
	if len(blocks) < 4 {
		t.Fatalf("%d yaml blocks in docs/engines.md, want one per engine", len(blocks))
	}
	kinds := map[EngineKind]bool{}
	for i, b := range blocks {
		cfg, err := ParseConfig([]byte(b.text))
		if err != nil {
			t.Errorf("docs/engines.md block %d (line %d): %v", i+1, b.line, err)
			continue
		}
		kinds[cfg.ContextServers.Engine.Kind()] = true
	}
	for _, k := range []EngineKind{EngineTether, EngineTRTLLM, EngineVLLM, EngineSGLang} {
		if !kinds[k] {
			t.Errorf("no configuration example for engine %s in docs/engines.md", k)
		}
	}
}

type docBlock struct {
	text string
	line int
}

// yamlBlocks extracts the ```yaml fenced blocks of a Markdown document.
func yamlBlocks(doc string) []docBlock {
	var out []docBlock
	var cur *strings.Builder
	start := 0
	for i, line := range strings.Split(doc, "\n") {
		switch {
		case cur == nil && strings.TrimSpace(line) == "```yaml":
			cur, start = &strings.Builder{}, i+2
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, docBlock{cur.String(), start})
			cur = nil
		case cur != nil:
			cur.WriteString(line)
			cur.WriteByte('\n')
		}
	}
	return out
}
