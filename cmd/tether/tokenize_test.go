package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTokenizePrintsIDsAndBlockKeys(t *testing.T) {
	var out bytes.Buffer
	if err := runTokenize(&out, []string{"--tokenizer", "../../internal/hftok/testdata/qwen3", "--block-size", "4", "--prompt", "Hello, my dog is cute"}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	// The ids the JavaScript reference gives (internal/hftok/testdata).
	if last := lines[len(lines)-1]; last != "[9707,11,847,5562,374,18838]" {
		t.Fatalf("last line %q, want the token ids", last)
	}
	if !strings.Contains(out.String(), "block 0:") || strings.Contains(out.String(), "block 1:") {
		t.Fatalf("want exactly one full block of 4:\n%s", out.String())
	}

	chat := filepath.Join(t.TempDir(), "chat.json")
	os.WriteFile(chat, []byte(`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi there"}]}]}`), 0o644)
	out.Reset()
	if err := runTokenize(&out, []string{"--chat", chat, "--block-size", "2"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"<|system|> be brief\n<|user|> hi there\n"`) {
		t.Fatalf("the words path renders the chat as the edge does:\n%s", out.String())
	}
	// With the model's tokenizer, the chat template renders the chat, as
	// the edge does for a fleet with tokenizer: hf:<dir>.
	out.Reset()
	if err := runTokenize(&out, []string{"--tokenizer", "../../internal/hftok/testdata/qwen3", "--chat", chat, "--block-size", "16"}); err != nil {
		t.Fatal(err)
	}
	if want := `"<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"`; !strings.Contains(out.String(), want) {
		t.Fatalf("want the Qwen3 template's rendering %s:\n%s", want, out.String())
	}
	for _, bad := range [][]string{
		{"--prompt", "x", "--chat", chat},
		{"--block-size", "0", "--prompt", "x"},
	} {
		if err := runTokenize(&out, bad); !errors.Is(err, errUsage) {
			t.Errorf("%q: error %v, want a usage error", bad, err)
		}
	}
}
