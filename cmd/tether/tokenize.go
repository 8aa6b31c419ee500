package main

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tether-project/tether/routing/chattmpl"
	"github.com/tether-project/tether/routing/hftok"
	"github.com/tether-project/tether/routing/prefix"
)

func init() {
	register("tokenize", "print a prompt's token ids and block keys the way tether computes them (debug a cache miss)", func(ctx context.Context, args []string) error {
		return runTokenize(os.Stdout, args)
	})
}

func runTokenize(out io.Writer, args []string) error {
	fs := newFlagSet("tokenize")
	tokDir := fs.String("tokenizer", "", "Hugging Face tokenizer: a directory holding tokenizer.json (or tokenizer.json.gz), or the file; empty: the words tokenizer of tether dev and the simulator")
	blockSize := fs.Int("block-size", prefix.DefaultBlockSize, "tokens per KV block (the engine's: vLLM 16, TensorRT-LLM tokens_per_block, SGLang page size)")
	promptText := fs.String("prompt", "", "the prompt text")
	chatFile := fs.String("chat", "", "a JSON file with an OpenAI chat request ({\"messages\": [...], \"tools\": [...], \"chat_template_kwargs\": {...}} or just [...] messages), rendered as the edge renders it: with --tokenizer, the model's chat_template of tokenizer_config.json beside tokenizer.json; else the words path's markers")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if (*promptText == "") == (*chatFile == "") {
		return fmt.Errorf("%w: give exactly one of --prompt or --chat", errUsage)
	}
	if *blockSize < 1 || *blockSize > 1<<20 {
		return fmt.Errorf("%w: --block-size %d out of range", errUsage, *blockSize)
	}
	text := *promptText
	if *chatFile != "" && *tokDir != "" {
		var err error
		if text, err = renderChat(*tokDir, *chatFile); err != nil {
			return err
		}
	} else if *chatFile != "" {
		msgs, err := readChat(*chatFile)
		if err != nil {
			return err
		}
		text = prefix.RenderChat(msgs)
	}
	var ids []uint32
	name := "words (tether dev, simulator)"
	if *tokDir != "" {
		tok, path, err := loadTokenizer(*tokDir)
		if err != nil {
			return err
		}
		ids, name = tok.Encode(text), "hf:"+path
	} else {
		ids = prefix.Tokenize(text)
	}
	blocks := prefix.BlockHashes(ids, *blockSize)
	fmt.Fprintf(out, "tokenizer:  %s\n", name)
	fmt.Fprintf(out, "rendered:   %q\n", text)
	fmt.Fprintf(out, "tokens:     %d\n", len(ids))
	fmt.Fprintf(out, "block size: %d (%d full blocks, %d tokens in the partial block)\n", *blockSize, len(blocks), len(ids)-len(blocks)**blockSize)
	for i, b := range blocks {
		fmt.Fprintf(out, "block %d:    %016x\n", i, b)
	}
	js, _ := json.Marshal(ids)
	if len(ids) == 0 {
		js = []byte("[]")
	}
	fmt.Fprintf(out, "%s\n", js)
	return nil
}

// loadTokenizer reads dir/tokenizer.json(.gz) or the file itself.
func loadTokenizer(dirOrFile string) (*hftok.Tokenizer, string, error) {
	path := dirOrFile
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(dirOrFile, "tokenizer.json")
		if _, err := os.Stat(path); err != nil {
			path += ".gz"
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, "", fmt.Errorf("--tokenizer: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, "", fmt.Errorf("--tokenizer %s: %w", path, err)
		}
		r = zr
	}
	data, err := io.ReadAll(io.LimitReader(r, 512<<20))
	if err != nil {
		return nil, "", fmt.Errorf("--tokenizer %s: %w", path, err)
	}
	tok, err := hftok.Load(data)
	if err != nil {
		return nil, "", fmt.Errorf("--tokenizer %s: %w", path, err)
	}
	return tok, path, nil
}

// readChat reads OpenAI chat messages; content is a string or text parts.
func readChat(path string) ([]prefix.Message, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--chat: %w", err)
	}
	type msg struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	var wrapped struct {
		Messages []msg `json:"messages"`
	}
	var list []msg
	if err := json.Unmarshal(data, &wrapped); err == nil && wrapped.Messages != nil {
		list = wrapped.Messages
	} else if err := json.Unmarshal(data, &list); err != nil {
		return nil, fmt.Errorf("--chat %s: want {\"messages\": [...]} or [...] of {role, content}: %v", path, err)
	}
	out := make([]prefix.Message, 0, len(list))
	for i, m := range list {
		var s string
		if err := json.Unmarshal(m.Content, &s); err != nil {
			var parts []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}
			if err := json.Unmarshal(m.Content, &parts); err != nil {
				return nil, fmt.Errorf("--chat %s: messages[%d].content: want a string or text parts", path, i)
			}
			var texts []string
			for _, p := range parts {
				if p.Type == "text" {
					texts = append(texts, p.Text)
				}
			}
			s = strings.Join(texts, "\n") // as the edge joins text parts
		}
		out = append(out, prefix.Message{Role: m.Role, Content: s})
	}
	return out, nil
}

// renderChat renders the chat request in chatFile with the chat template of
// the tokenizer_config.json next to the tokenizer (routing/chattmpl, as the
// edge does for a fleet with tokenizer: hf:<dir>).
func renderChat(tokDir, chatFile string) (string, error) {
	dir := tokDir
	if st, err := os.Stat(dir); err == nil && !st.IsDir() {
		dir = filepath.Dir(dir)
	}
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	cfg, err := os.ReadFile(cfgPath)
	if err != nil {
		return "", fmt.Errorf("--tokenizer: the chat template: %w", err)
	}
	tpl, err := chattmpl.FromTokenizerConfig(cfg)
	if err != nil {
		return "", fmt.Errorf("--tokenizer %s: %w", cfgPath, err)
	}
	data, err := os.ReadFile(chatFile)
	if err != nil {
		return "", fmt.Errorf("--chat: %w", err)
	}
	in := chattmpl.Input{AddGenerationPrompt: true, Now: time.Now()}
	var req map[string]json.RawMessage
	if err := json.Unmarshal(data, &req); err == nil {
		in.Messages, in.Tools, in.Kwargs = req["messages"], req["tools"], req["chat_template_kwargs"]
		if raw, ok := req["add_generation_prompt"]; ok {
			if err := json.Unmarshal(raw, &in.AddGenerationPrompt); err != nil {
				return "", fmt.Errorf("--chat %s: add_generation_prompt: %w", chatFile, err)
			}
		}
	} else {
		in.Messages = data
	}
	if string(in.Kwargs) == "null" {
		in.Kwargs = nil
	}
	text, err := tpl.Render(in)
	if err != nil {
		return "", fmt.Errorf("--chat %s: %w", chatFile, err)
	}
	return text, nil
}
