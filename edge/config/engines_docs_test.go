package config

import (
	"os"
	"testing"

	"github.com/tether-project/tether/test/repo"
)

// Every YAML block of docs/engines.md is a configuration the edge's
// decoder accepts, and the blocks cover every engine kind.
func TestEnginesDocExamplesParse(t *testing.T) {
	for _, env := range []string{EnvInternalRequestAuthKey, EnvAdminToken, EnvClusterAuthKey} {
		t.Setenv(env, "")
	}
	doc, err := os.ReadFile("../../docs/engines.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := repo.YAMLBlocks(string(doc))
	if len(blocks) < 4 {
		t.Fatalf("%d yaml blocks in docs/engines.md, want one per engine", len(blocks))
	}
	kinds := map[EngineKind]bool{}
	for i, b := range blocks {
		cfg, err := ParseConfig([]byte(b.Text))
		if err != nil {
			t.Errorf("docs/engines.md block %d (line %d): %v", i+1, b.Line, err)
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
