package hftok

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
)

// EncodeFrom gives Encode's ids whatever the previous text: a growing chat,
// an edited middle, a shorter text, texts that differ inside or right after
// an added token.
func TestEncodeFromEqualsEncode(t *testing.T) {
	tok := qwen3(t)
	data, err := os.ReadFile("testdata/qwen3_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var prompts []struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal(data, &prompts); err != nil {
		t.Fatal(err)
	}
	var texts []string
	chat := ""
	for i, p := range prompts {
		if i%5 != 0 {
			continue
		}
		chat += "<|im_start|>user\n" + p.Text + "<|im_end|>\n<|im_start|>assistant\n"
		texts = append(texts, chat)
		chat += "ok " + p.Text[:len(p.Text)/2] + "<|im_end|>\n"
		texts = append(texts, chat)
	}
	edited := strings.Replace(chat, "Hello", "Howdy", 1)
	texts = append(texts, edited, chat[:len(chat)/2], chat,
		chat+"<|im_end|>x", chat+"<|im_e", chat+"<|im_end|>", chat+"<|im_end|><|endoftext|>", chat+"<|endoftext|>", "")
	var prev *Encoded
	for i, text := range texts {
		got := tok.EncodeFrom(prev, text)
		if want := tok.Encode(text); !slices.Equal(got.IDs, want) {
			t.Fatalf("text %d (%d bytes): EncodeFrom differs from Encode", i, len(text))
		}
		if got.Text != text {
			t.Fatalf("text %d: Text not kept", i)
		}
		prev = got
	}
}

// The second turn of a long chat re-encodes only what follows the shared
// prefix's last added token.
func TestEncodeFromReusesThePrefix(t *testing.T) {
	tok := qwen3(t)
	first := "<|im_start|>system\n" + strings.Repeat("A long system prompt. ", 500) + "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
	prev := tok.EncodeFrom(nil, first)
	next := tok.EncodeFrom(prev, first+"<|im_start|>assistant\nhello<|im_end|>\n")
	if !slices.Equal(next.IDs, tok.Encode(next.Text)) {
		t.Fatal("ids differ from Encode")
	}
	if &next.IDs[0] == &prev.IDs[0] {
		t.Fatal("the result shares the previous ids' array (a later append could overwrite them)")
	}
	if n := len(next.cuts); n < len(prev.cuts) || next.cuts[len(prev.cuts)-1] != prev.cuts[len(prev.cuts)-1] {
		t.Fatalf("cuts not carried over: %v then %v", prev.cuts, next.cuts)
	}
}
