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

	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/chattmpl"
	"github.com/tether-project/tether/internal/hftok"
	"github.com/tether-project/tether/internal/prefix"
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
	chatFile := fs.String("chat", "", "a JSON file with a request body of --api ({\"messages\": [...], \"tools\": [...], \"chat_template_kwargs\": {...}} or just [...] messages for chat), rendered as the edge renders it: with --tokenizer, the model's chat_template of tokenizer_config.json beside tokenizer.json; else the words path's markers")
	api := fs.String("api", "chat", "the dialect of the --chat file: chat (OpenAI chat completions), messages (an Anthropic Messages body) or responses (a Responses API body), converted to the chat form as the edge converts it")
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
	if *chatFile != "" {
		req, err := readRequest(*chatFile, *api)
		if err != nil {
			return err
		}
		if *tokDir != "" {
			if text, err = renderChat(*tokDir, *chatFile, req); err != nil {
				return err
			}
		} else {
			text = prefix.RenderChat(req.Messages)
		}
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

// readRequest reads a request body of dialect api with the request model
// the edge parses it with (internal/apireq). A chat file may hold just the
// messages array, and needs no model.
func readRequest(path, api string) (*apireq.Request, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--chat: %w", err)
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(data, &top) != nil {
		if api != "chat" {
			return nil, fmt.Errorf("--chat %s: want a JSON object (a %s request body)", path, api)
		}
		top = map[string]json.RawMessage{"messages": data}
	}
	if _, ok := top["model"]; !ok {
		top["model"] = json.RawMessage(`"tokenize"`)
	}
	body, _ := json.Marshal(top)
	var req *apireq.Request
	var aerr *apireq.Error
	switch api {
	case "chat":
		req, aerr = apireq.Parse(apireq.Chat, body)
	case "messages":
		req, aerr = apireq.ParseCountTokens(body) // max_tokens does not matter here
	case "responses":
		req, aerr = apireq.Parse(apireq.Responses, body)
	default:
		return nil, fmt.Errorf("%w: --api %q is not chat, messages or responses", errUsage, api)
	}
	if aerr != nil {
		return nil, fmt.Errorf("--chat %s: %s", path, aerr.Message)
	}
	return req, nil
}

// renderChat renders the request's chat form with the chat template of
// the tokenizer_config.json next to the tokenizer (internal/chattmpl, as the
// edge does for a fleet with tokenizer: hf:<dir>).
func renderChat(tokDir, chatFile string, req *apireq.Request) (string, error) {
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
	chat := req.Chat
	in := chattmpl.Input{AddGenerationPrompt: true, Now: time.Now(), Messages: chat["messages"], Tools: chat["tools"], Kwargs: chat["chat_template_kwargs"]}
	if raw, ok := chat["add_generation_prompt"]; ok {
		if err := json.Unmarshal(raw, &in.AddGenerationPrompt); err != nil {
			return "", fmt.Errorf("--chat %s: add_generation_prompt: %w", chatFile, err)
		}
	}
	if apireq.IsNull(in.Kwargs) {
		in.Kwargs = nil
	}
	if apireq.IsNull(in.Tools) {
		in.Tools = nil
	}
	text, err := tpl.Render(in)
	if err != nil {
		return "", fmt.Errorf("--chat %s: %w", chatFile, err)
	}
	return text, nil
}
