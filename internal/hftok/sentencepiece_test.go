package hftok

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"slices"
	"testing"
)

// loadRaw reads a gzip-compressed file.
func loadRaw(t testing.TB, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func loadGz(t testing.TB, path string) *Tokenizer {
	t.Helper()
	tok, err := Load(loadRaw(t, path))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// SentencePiece-style files (byte-fallback BPE) token for token with the
// JavaScript reference (testdata/spgen/build.mjs) on every committed
// prompt: Mistral 7B's vocabulary with the Metaspace pre-tokenizer (ids)
// and with the Prepend/Replace normalizer of Llama 2 and the original
// Mistral file (legacy_ids, which build.mjs also checked against
// mistral-tokenizer-js's own encoder).
func TestSentencePieceMatchesJavaScriptReference(t *testing.T) {
	data, err := os.ReadFile("testdata/mistral_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var golden struct {
		Prompts []struct {
			Text   string   `json:"text"`
			IDs    []uint32 `json:"ids"`
			Legacy []uint32 `json:"legacy_ids"`
		} `json:"prompts"`
	}
	if err := json.Unmarshal(data, &golden); err != nil {
		t.Fatal(err)
	}
	if len(golden.Prompts) < 150 {
		t.Fatalf("%d golden prompts, want at least 150", len(golden.Prompts))
	}
	for _, form := range []struct {
		dir    string
		legacy bool
	}{{"testdata/mistral/tokenizer.json.gz", false}, {"testdata/mistral-legacy/tokenizer.json.gz", true}} {
		tok := loadGz(t, form.dir)
		bad := 0
		for i, g := range golden.Prompts {
			want := g.IDs
			if form.legacy {
				want = g.Legacy
			}
			if got := tok.Encode(g.Text); !slices.Equal(got, want) {
				bad++
				if bad <= 5 {
					t.Errorf("%s prompt %d %q:\n got %v\nwant %v", form.dir, i, truncate(g.Text, 80), got, want)
				}
			}
			// Resuming after an added token gives the same ids.
			if e := tok.EncodeFrom(tok.EncodeFrom(nil, g.Text), g.Text+" more"); !slices.Equal(e.IDs, tok.Encode(g.Text+" more")) {
				t.Errorf("%s prompt %d: EncodeFrom differs from Encode", form.dir, i)
			}
		}
		if bad > 0 {
			t.Fatalf("%s: %d of %d prompts differ from the reference", form.dir, bad, len(golden.Prompts))
		}
	}
}

func TestSentencePieceRejectsWhatItDoesNotImplement(t *testing.T) {
	for _, doc := range []string{
		`{"model":{"type":"BPE","byte_fallback":true,"vocab":{}},"pre_tokenizer":{"type":"ByteLevel"}}`,
		`{"model":{"type":"BPE","byte_fallback":true,"vocab":{}},"normalizer":{"type":"NFKC"}}`,
		`{"model":{"type":"BPE","byte_fallback":true,"vocab":{}},"normalizer":{"type":"Replace","pattern":{"Regex":" +"},"content":"x"}}`,
		`{"model":{"type":"BPE","byte_fallback":true,"vocab":{},"dropout":0.1}}`,
		`{"model":{"type":"BPE","byte_fallback":true,"vocab":{}},"pre_tokenizer":{"type":"Metaspace","prepend_scheme":"sometimes"}}`,
	} {
		if _, err := Load([]byte(doc)); err == nil {
			t.Errorf("Load(%s): want an error", doc)
		}
	}
}
