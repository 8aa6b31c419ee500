// Package tokenize turns a request's prompt into each fleet's tokens and
// block keys the way that fleet's engine cuts them (context_servers.tokenizer,
// generation_servers.tokenizer): the words tokenizer of internal/prefix (what
// tether's simulated workers use), or the model's own tokenizer and chat
// template from an hf:<dir> (internal/hftok, internal/chattmpl: rendered and
// tokenized as the engine's server does, resumed from each conversation's
// last prompt in a cache bounded in bytes), hashed into blocks of the fleet's
// block size, under a LoRA adapter's seed when the request names one. It
// reads the tokenizer files once, when the edge starts (Load).
package tokenize

import (
	"bytes"
	"compress/gzip"
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tether-project/tether/edge/config"
	"github.com/tether-project/tether/fsm"
	"github.com/tether-project/tether/internal/apireq"
	"github.com/tether-project/tether/internal/chattmpl"
	"github.com/tether-project/tether/internal/hftok"
	"github.com/tether-project/tether/internal/prefix"
)

// DefaultTokenizeCacheBytes bounds the per-conversation tokenize cache of
// each hf: tokenizer (rendered prompt and token ids of each conversation's
// last turn, least recently used dropped first).
const DefaultTokenizeCacheBytes = 64 << 20

// maxTokenizerFile bounds what the edge reads of a tokenizer file
// (Qwen3's tokenizer.json is 11 MB).
const maxTokenizerFile = 256 << 20

// Fleet turns one fleet's prompts into tokens and block keys the way that
// fleet's engine does.
type Fleet struct {
	blockSize int
	model     *hfModel // nil: the words tokenizer
}

// Fleets are one model's fleet tokenizers, by fsm.Fleet.
type Fleets [3]Fleet

// BlockSize is the fleet's block size in tokens.
func (f Fleet) BlockSize() int { return f.blockSize }

// Model is the directory of the fleet's hf: tokenizer and whether its
// configuration has a chat template (ok false: the words tokenizer).
func (f Fleet) Model() (dir string, chatTemplate, ok bool) {
	if f.model == nil {
		return "", false, false
	}
	return f.model.dir, f.model.tpl != nil, true
}

// Load reads each fleet's hf: directory of cfg (one model's configuration)
// once: fleets naming the same directory share the model and its cache.
// Errors name the fleet's tokenizer key.
func Load(cfg *config.Config) (Fleets, error) {
	var out Fleets
	loaded := map[string]*hfModel{}
	for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
		s := cfg.Servers(f)
		out[f].blockSize = cfg.RoutingConfig(f).BlockSize
		dir, ok := strings.CutPrefix(s.Tokenizer, config.TokenizerHFPrefix)
		if !ok {
			continue
		}
		if m := loaded[dir]; m != nil {
			out[f].model = m
			continue
		}
		m, err := loadHFModel(dir, DefaultTokenizeCacheBytes)
		if err != nil {
			return out, fmt.Errorf("%s.tokenizer: %w", fleetKey(f), err)
		}
		loaded[dir], out[f].model = m, m
	}
	return out, nil
}

func fleetKey(f fsm.Fleet) string {
	if f == fsm.FleetGeneration {
		return "generation_servers"
	}
	return "context_servers"
}

// hfModel is a model's tokenizer and chat template, with a cache of each
// conversation's last encoded prompt.
type hfModel struct {
	dir   string
	tok   *hftok.Tokenizer
	tpl   *chattmpl.Template // nil: the config has no chat template
	cache *convCache
}

func loadHFModel(dir string, cacheBytes int) (*hfModel, error) {
	data, err := readTokenizerJSON(dir)
	if err != nil {
		return nil, err
	}
	tok, err := hftok.Load(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	m := &hfModel{dir: dir, tok: tok, cache: newConvCache(cacheBytes)}
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	cfgData, err := readLimited(cfgPath)
	if err != nil {
		return nil, err
	}
	var probe struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	if err := json.Unmarshal(cfgData, &probe); err != nil {
		return nil, fmt.Errorf("%s: %w", cfgPath, err)
	}
	if len(probe.ChatTemplate) > 0 && string(probe.ChatTemplate) != "null" {
		if m.tpl, err = chattmpl.FromTokenizerConfig(cfgData); err != nil {
			return nil, fmt.Errorf("%s: %w", cfgPath, err)
		}
	}
	return m, nil
}

// readTokenizerJSON reads dir/tokenizer.json, or dir/tokenizer.json.gz.
func readTokenizerJSON(dir string) ([]byte, error) {
	path := filepath.Join(dir, "tokenizer.json")
	data, err := readLimited(path)
	if !errors.Is(err, os.ErrNotExist) {
		return data, err
	}
	gz, gzErr := readLimited(path + ".gz")
	if gzErr != nil {
		return nil, err // name the plain file: it is the usual one
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, fmt.Errorf("%s.gz: %w", path, err)
	}
	data, err = io.ReadAll(io.LimitReader(zr, maxTokenizerFile+1))
	if err != nil {
		return nil, fmt.Errorf("%s.gz: %w", path, err)
	}
	if len(data) > maxTokenizerFile {
		return nil, fmt.Errorf("%s.gz: larger than %d bytes uncompressed", path, maxTokenizerFile)
	}
	return data, nil
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxTokenizerFile+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(data) > maxTokenizerFile {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxTokenizerFile)
	}
	return data, nil
}

// promptText is what the engine tokenizes for p (rendered at now): the
// chat rendered with the model's template, or a completions prompt string.
// ok is false for a prompt of token ids (the engine takes them as they
// are).
func (m *hfModel) promptText(p *apireq.Request, now time.Time) (text string, ok bool, err error) {
	if !p.Dialect.HasConversation() {
		if p.PromptIDs != nil {
			return "", false, nil // token ids
		}
		return p.Prompt, true, nil
	}
	if m.tpl == nil {
		return "", false, errors.New("tokenizer_config.json has no chat_template")
	}
	// Messages and Responses render as vLLM renders them: their chat form
	// (internal/apireq).
	chat := p.Chat
	addGen := true // vLLM's default for chat completions
	if raw, ok := chat["add_generation_prompt"]; ok && !apireq.IsNull(raw) {
		if err := json.Unmarshal(raw, &addGen); err != nil {
			return "", false, fmt.Errorf("add_generation_prompt: %w", err)
		}
	}
	kwargs := chat["chat_template_kwargs"]
	if apireq.IsNull(kwargs) {
		kwargs = nil
	}
	tools := chat["tools"]
	if apireq.IsNull(tools) {
		tools = nil
	}
	text, err = m.tpl.Render(chattmpl.Input{
		Messages: chat["messages"], Tools: tools, AddGenerationPrompt: addGen, Kwargs: kwargs, Now: now,
	})
	return text, err == nil, err
}

// encode tokenizes text, resuming from the conversation's last prompt when
// it shares a prefix (conv "" is not cached).
func (m *hfModel) encode(conv, text string) []uint32 {
	if conv == "" {
		return m.tok.Encode(text)
	}
	enc := m.tok.EncodeFrom(m.cache.get(conv), text)
	m.cache.put(conv, enc)
	return enc.IDs
}

// Prompt is one fleet's view of a request's prompt: its tokens and block
// keys.
type Prompt struct {
	Tokens int
	Blocks []uint64
}

// Request is what a request's prompt keys depend on.
type Request struct {
	// Parsed is the request's body; Words its tokens by the words
	// tokenizer (apireq.Request.WordTokens).
	Parsed *apireq.Request
	Words  []uint32
	// Conversation keys the tokenize cache ("" is not cached).
	Conversation string
	// Adapter is the LoRA adapter the request names ("" none): the
	// engine keys its blocks by it too.
	Adapter string
	// Now is the time a chat template may render.
	Now time.Time
}

// Keys are each fleet's prompt tokens and block keys for r; aggregated:
// the model's requests go whole to the context fleet (no generation hop).
// A prompt the model's template cannot render (the engine will answer it
// with its own error) gets no block keys and the words count.
func (fs *Fleets) Keys(r Request, aggregated bool, log *slog.Logger) [3]Prompt {
	var out [3]Prompt
	for _, f := range []fsm.Fleet{fsm.FleetContext, fsm.FleetGeneration} {
		ft := fs[f]
		// One fleet's keys serve both when they cut alike, and an
		// aggregated deployment (vLLM, SGLang) has no generation hop.
		if f == fsm.FleetGeneration && (ft == fs[fsm.FleetContext] || aggregated) {
			out[f] = out[fsm.FleetContext]
			continue
		}
		toks := r.Words
		if ft.model != nil {
			text, ok, err := ft.model.promptText(r.Parsed, r.Now)
			switch {
			case err != nil:
				log.Debug("prompt not tokenized with the model's tokenizer", "fleet", f.String(), "err", err)
				out[f] = Prompt{Tokens: len(r.Words)}
				continue
			case ok:
				toks = ft.model.encode(r.Conversation, text)
			}
		}
		out[f] = Prompt{Tokens: len(toks), Blocks: prefix.AdapterBlockHashes(r.Adapter, toks, ft.blockSize)}
	}
	return out
}

// convCache keeps each conversation's last encoded prompt, bounded in
// bytes, least recently used dropped first.
type convCache struct {
	mu       sync.Mutex
	maxBytes int
	bytes    int
	lru      *list.List // of *convEntry, most recent at the front
	byConv   map[string]*list.Element
}

type convEntry struct {
	conv string
	enc  *hftok.Encoded
	size int
}

func newConvCache(maxBytes int) *convCache {
	return &convCache{maxBytes: maxBytes, lru: list.New(), byConv: map[string]*list.Element{}}
}

func (c *convCache) get(conv string) *hftok.Encoded {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byConv[conv]
	if !ok {
		return nil
	}
	c.lru.MoveToFront(el)
	return el.Value.(*convEntry).enc
}

func (c *convCache) put(conv string, enc *hftok.Encoded) {
	size := enc.Bytes() + len(conv) + 128
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byConv[conv]; ok {
		c.bytes -= el.Value.(*convEntry).size
		c.lru.Remove(el)
		delete(c.byConv, conv)
	}
	if size > c.maxBytes {
		return // a prompt larger than the whole cache is not kept
	}
	for c.bytes+size > c.maxBytes {
		old := c.lru.Back()
		ent := old.Value.(*convEntry)
		c.lru.Remove(old)
		delete(c.byConv, ent.conv)
		c.bytes -= ent.size
	}
	c.byConv[conv] = c.lru.PushFront(&convEntry{conv: conv, enc: enc, size: size})
	c.bytes += size
}

// stats returns the entries and bytes held.
func (c *convCache) stats() (entries, bytes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len(), c.bytes
}
