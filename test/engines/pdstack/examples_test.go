package pdstack

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-project/tether/edge"
	"github.com/tether-project/tether/test/engines/oaiserve"
	"github.com/tether-project/tether/test/testhttp"
)

var root = filepath.Join("..", "..", "..")

func setSecrets(t *testing.T) {
	t.Setenv(edge.EnvAdminToken, "pdstack-admin-token-0123456789abcdef")
	t.Setenv(edge.EnvClusterAuthKey, "pdstack-cluster-key-0123456789abcdef")
}

// pdExamples are deploy's prefill/decode edge configs and the docs' YAML
// blocks of a prefill/decode split (both fleets naming vllm or sglang).
func pdExamples(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, d := range []string{"vllm-pd", "sglang-pd"} {
		b, err := os.ReadFile(filepath.Join(root, "deploy", d, "edge.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		out["deploy/"+d] = string(b)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "engines.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cur *strings.Builder
	for i, l := range strings.Split(string(doc), "\n") {
		switch {
		case cur == nil && strings.TrimSpace(l) == "```yaml":
			cur = &strings.Builder{}
		case cur != nil && strings.TrimSpace(l) == "```":
			m, err := ParseExample(cur.String())
			if err != nil {
				t.Fatalf("docs/engines.md block ending on line %d: %v", i+1, err)
			}
			if fs := fleets(m); len(fs) == 2 && (fs[1].engine == "vllm" || fs[1].engine == "sglang") {
				out[fmt.Sprintf("docs/engines.md:%d", i+1)] = cur.String()
			}
			cur = nil
		case cur != nil:
			cur.WriteString(l + "\n")
		}
	}
	if len(out) < 4 {
		t.Fatalf("%d prefill/decode examples, want deploy's two and the docs' two", len(out))
	}
	return out
}

func chat(t *testing.T, url, model, conv, parent, msg string) (int, string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"max_tokens":3,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`,
		model, strings.Repeat("a shared system prompt ", 30), msg)
	h := map[string]string{"x-session-id": conv}
	if parent != "" {
		h["X-Dynamo-Parent-Session-ID"] = parent
	}
	a := testhttp.PostRetrying(t, nil, url+"/v1/chat/completions", []byte(body), h)
	return a.Status, string(a.Body)
}

// Every published prefill/decode example runs as written: three edges form
// one Raft group and serve a conversation and a sub-agent through the
// split, from each edge, every request prefilled once and decoded from the
// handed-off KV.
func TestPDExamplesServe(t *testing.T) {
	setSecrets(t)
	for name, text := range pdExamples(t) {
		t.Run(name, func(t *testing.T) {
			s, err := StartExample(context.Background(), text, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if len(s.Prefill) == 0 || len(s.Decode) == 0 {
				t.Fatalf("prefill %v, decode %v", s.Prefill, s.Decode)
			}
			for i, u := range s.EdgeURLs() {
				msg := fmt.Sprintf("hello from edge %d", i+1)
				parent := ""
				if i == 2 {
					parent = "example-conv"
				}
				if st, b := chat(t, u, s.Model, fmt.Sprintf("example-conv-%d", i), parent, msg); st != http.StatusOK {
					t.Fatalf("edge %d: %d %s", i+1, st, b)
				}
				prefilled, decoded := 0, 0
				for _, srv := range s.Servers {
					for _, sv := range srv.Served() {
						switch {
						case sv.LastUser != msg:
						case sv.Handoff == oaiserve.HandoffPrefill:
							prefilled++
						case sv.Handoff == oaiserve.HandoffDecode && !sv.KVMismatch:
							decoded++
						default:
							t.Fatalf("%s: %+v", msg, sv)
						}
					}
				}
				if prefilled != 1 || decoded != 1 {
					t.Fatalf("%s: prefilled %d times, decoded %d times", msg, prefilled, decoded)
				}
			}
		})
	}
}

// computed is the prompt tokens every engine of s computed.
func computed(s *Stack) int64 {
	var n int64
	for _, srv := range s.Servers {
		c, _, _ := srv.PromptTokensBySource()
		n += c
	}
	return n
}

// The benchmark's three setups on deploy/vllm-pd's servers: the split
// computes a new prompt once, the aggregated servers once, the proxy's
// emulated disaggregation twice (its generation engine prefills again).
func TestBenchSetupsPrefillWork(t *testing.T) {
	setSecrets(t)
	b, err := os.ReadFile(filepath.Join(root, "deploy", "vllm-pd", "edge.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	agg, err := Aggregated(string(b))
	if err != nil {
		t.Fatal(err)
	}
	setups := []struct {
		name  string
		start func() (*Stack, error)
		times int64
	}{
		{"prefill/decode", func() (*Stack, error) { return StartExample(context.Background(), string(b), Options{}) }, 1},
		{"aggregated", func() (*Stack, error) { return StartExample(context.Background(), agg, Options{}) }, 1},
		{"emulated", func() (*Stack, error) { return StartEmulated(context.Background(), string(b), Options{}) }, 2},
	}
	for _, su := range setups {
		t.Run(su.name, func(t *testing.T) {
			s, err := su.start()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			u := s.EdgeURLs()[0]
			st, body := chat(t, u, s.Model, "work-conv", "", "count the prefill")
			if st != http.StatusOK {
				t.Fatalf("%d %s", st, body)
			}
			var ans struct {
				Usage struct {
					PromptTokens int64 `json:"prompt_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal([]byte(body), &ans); err != nil || ans.Usage.PromptTokens == 0 {
				t.Fatalf("%v: %s", err, body)
			}
			// A new prompt: every token but the ones the decode
			// recomputes (vLLM: the last) is computed su.times.
			got := computed(s)
			if lo, hi := su.times*ans.Usage.PromptTokens, su.times*ans.Usage.PromptTokens+1; got < lo || got > hi {
				t.Fatalf("the engines computed %d prompt tokens for one %d-token prompt, want %d×", got, ans.Usage.PromptTokens, su.times)
			}
		})
	}
}
