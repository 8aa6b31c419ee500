package chattmpl

import (
	"encoding/json"
	"errors"
	"fmt"
)

// FromTokenizerConfig parses the chat_template of a tokenizer_config.json
// (its bytes: reading the file is the caller's) with its special tokens as
// template variables. A config whose chat_template is a list of named
// templates uses the one named "default".
func FromTokenizerConfig(data []byte) (*Template, error) {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("tokenizer_config.json: %w", err)
	}
	src, err := templateSource(cfg["chat_template"])
	if err != nil {
		return nil, fmt.Errorf("tokenizer_config.json: chat_template: %w", err)
	}
	specials := map[string]string{}
	for _, k := range []string{"bos_token", "eos_token", "unk_token", "pad_token"} {
		if s, ok := tokenText(cfg[k]); ok {
			specials[k] = s
		}
	}
	return Parse(src, specials)
}

func templateSource(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", errors.New("missing")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", errors.New("neither a string nor a list of named templates")
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return "", errors.New("no template named \"default\"")
}

// tokenText reads a special token written as a string or as an AddedToken
// object ({"content": ...}).
func tokenText(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Content != nil {
		return *obj.Content, true
	}
	return "", false
}
