package chattmpl

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/tether-project/tether/internal/hftok"
)

const qwenDir = "../hftok/testdata/qwen3/"

func qwenTemplate(t testing.TB) *Template {
	t.Helper()
	data, err := os.ReadFile(qwenDir + "tokenizer_config.json")
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := FromTokenizerConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

func qwenTokenizer(t testing.TB) *hftok.Tokenizer {
	t.Helper()
	f, err := os.Open(qwenDir + "tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := hftok.Load(data)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

type golden struct {
	Name    string `json:"name"`
	Request struct {
		Messages json.RawMessage `json:"messages"`
		Tools    json.RawMessage `json:"tools"`
	} `json:"request"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	Kwargs              json.RawMessage `json:"kwargs"`
	Rendered            string          `json:"rendered"`
	IDs                 []uint32        `json:"ids"`
}

// Byte for byte (prompt) and token for token (ids) with @huggingface/jinja
// and @lenml/tokenizers on every committed conversation
// (../hftok/testdata/gen/chat.mjs).
func TestQwen3MatchesJavaScriptReference(t *testing.T) {
	data, err := os.ReadFile("testdata/qwen3_chat_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Cases []golden `json:"cases"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Cases) < 20 {
		t.Fatalf("only %d golden conversations", len(file.Cases))
	}
	tpl, tok := qwenTemplate(t), qwenTokenizer(t)
	gonjaFailed := 0
	for _, c := range file.Cases {
		kw := c.Kwargs
		if string(kw) == "null" {
			kw = nil
		}
		got, err := tpl.Render(Input{Messages: c.Request.Messages, Tools: c.Request.Tools, AddGenerationPrompt: c.AddGenerationPrompt, Kwargs: kw})
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		if got != c.Rendered {
			t.Errorf("%s: rendered differs at byte %d\n got: %q\nwant: %q", c.Name, firstDiff(got, c.Rendered), got, c.Rendered)
			continue
		}
		if ids := tok.Encode(got); !slices.Equal(ids, c.IDs) {
			t.Errorf("%s: token ids differ\n got: %v\nwant: %v", c.Name, ids, c.IDs)
		}
		// The template's own text through gonja (the path of templates
		// without a native renderer) gives the same bytes, where gonja can
		// render at all (it cannot call methods on an empty string).
		gonja := *tpl
		gonja.native = nil
		if out, err := gonja.Render(Input{Messages: c.Request.Messages, Tools: c.Request.Tools, AddGenerationPrompt: c.AddGenerationPrompt, Kwargs: kw}); err != nil {
			t.Logf("%s: gonja: %v", c.Name, err)
			gonjaFailed++
		} else if out != c.Rendered {
			t.Errorf("%s: gonja renders differently at byte %d", c.Name, firstDiff(out, c.Rendered))
		}
	}
	if gonjaFailed > 1 {
		t.Errorf("gonja failed on %d golden conversations, want only the one with empty strings", gonjaFailed)
	}
}

func firstDiff(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestRenderRejectsBadRequests(t *testing.T) {
	tpl := qwenTemplate(t)
	cases := []struct{ name, messages, tools, want string }{
		{"not an array", `{"role":"user"}`, "", "not a JSON array"},
		{"no role", `[{"content":"x"}]`, "", "messages[0]: role missing"},
		{"image part", `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]`, "", "part type image_url"},
		{"bad arguments", `[{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{nope"}}]}]`, "", "arguments"},
		{"tool without function", `[{"role":"user","content":"x"}]`, `[{"type":"function"}]`, "tools[0].function"},
		{"too deep", `[{"role":"user","content":"x","z":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}]`, "", "nested deeper"},
		{"malformed", `[{"role":`, "", "messages"},
	}
	for _, c := range cases {
		_, err := tpl.Render(Input{Messages: json.RawMessage(c.messages), Tools: json.RawMessage(c.tools)})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to mention %q", c.name, err, c.want)
		}
	}
}

// A template cannot read files, and raise_exception surfaces as an error.
func TestTemplateIsSandboxed(t *testing.T) {
	for src, want := range map[string]string{
		`{% include "/etc/passwd" %}`:            "may not load",
		`{{ raise_exception("no tools here") }}`: "no tools here",
		`{{ strftime_now("%d %b %Y") }}`:         "no time given",
	} {
		tpl, err := Parse(src, nil)
		if err == nil {
			_, err = tpl.Render(Input{Messages: json.RawMessage(`[]`)})
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", src, err, want)
		}
	}
	tpl, err := Parse(`{{ bos_token }}{{ strftime_now("%d %b %Y") }}`, map[string]string{"bos_token": "<s>"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := tpl.Render(Input{Messages: json.RawMessage(`[]`), Now: time.Date(2026, 7, 4, 0, 0, 0, 0, time.UTC)})
	if err != nil || got != "<s>04 Jul 2026" {
		t.Fatalf("got %q, %v", got, err)
	}
}

// tojson is Python's json.dumps: key order kept, ", " / ": ", non-ASCII kept,
// floats as Python's repr, indent and sort_keys honoured.
func TestToJSONIsPythonJSONDumps(t *testing.T) {
	cases := []struct{ src, data, want string }{
		{`{{ x | tojson }}`, `{"b":1,"a":[true,null,"é\u0001"],"c":{"z":2.5,"y":1.0,"w":1e-7,"v":1e22}}`,
			`{"b": 1, "a": [true, null, "é\u0001"], "c": {"z": 2.5, "y": 1.0, "w": 1e-07, "v": 1e+22}}`},
		{`{{ x | tojson(indent=2) }}`, `{"b":[1,2],"a":{}}`, "{\n  \"b\": [\n    1,\n    2\n  ],\n  \"a\": {}\n}"},
		{`{{ x | tojson(sort_keys=true, ensure_ascii=true) }}`, `{"b":"😀","a":"é\u007f"}`, `{"a": "\u00e9\u007f", "b": "\ud83d\ude00"}`},
	}
	for _, c := range cases {
		tpl, err := Parse(c.src, nil)
		if err != nil {
			t.Fatal(err)
		}
		v, err := decodeOrdered([]byte(c.data))
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := tpl.tpl.Execute(&b, exec.NewContext(map[string]any{"x": v})); err != nil {
			t.Fatal(err)
		}
		if b.String() != c.want {
			t.Errorf("%s on %s:\n got %s\nwant %s", c.src, c.data, b.String(), c.want)
		}
	}
}

// The ordered decoder accepts what encoding/json accepts, with the same
// values, and rejects what it rejects.
func TestDecodeOrderedAgreesWithEncodingJSON(t *testing.T) {
	for _, doc := range []string{
		`{"b":1,"a":[true,false,null,-1.5e3,0,"x\u00e9\n\"\\"],"c":{},"d":[]}`,
		` [ "é😀" , {"k" : "v"} ] `, `"\ud83d\ude00"`, `"a\/b\b\f\r\t\u00e9\u4e2d x\ud83d\ude00y"`, `"lone \ud83d here"`,
		`"lone low \ude00"`, `"pair then \ud83d\u0041"`, `"end \ud83d"`, `"\u0000nul"`, "\"bad \xff utf8\"", `{"a":1,"a":2}`, `123456789012345678901234567890`,
	} {
		got, err := decodeOrdered([]byte(doc))
		if err != nil {
			t.Errorf("%s: %v", doc, err)
			continue
		}
		var want any
		if err := json.Unmarshal([]byte(doc), &want); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		if err := writeJSON(&b, got, &jsonOpts{itemSep: ",", keySep: ":", sortKeys: true}, 0); err != nil {
			t.Fatal(err)
		}
		var back any
		if err := json.Unmarshal([]byte(b.String()), &back); err != nil {
			t.Fatalf("%s: re-encoded %s: %v", doc, b.String(), err)
		}
		if wantJSON, _ := json.Marshal(want); string(mustJSON(t, back)) != string(wantJSON) {
			t.Errorf("%s: decoded as %s, want %s", doc, mustJSON(t, back), wantJSON)
		}
	}
	for _, doc := range []string{``, `{`, `[1,]`, `{"a"}`, `{"a":1,}`, `tru`, `"x`, "\"a\tb\"", `1.2.3`, `[1] 2`, `{1:2}`, `-`, `"\x"`, `"\u12"`, `"\uZZZZ"`} {
		if _, err := decodeOrdered([]byte(doc)); err == nil {
			t.Errorf("%q: want an error", doc)
		}
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A template that iterates message content parts gets content as a list of
// text parts (vLLM's "openai" content format); Qwen3's, which reads content
// as a string, gets a string.
func TestContentFormat(t *testing.T) {
	const partsTpl = `{%- for message in messages %}{{ message.role }}:{% if message.content is string %}S{{ message.content }}{% else %}{% for part in message['content'] %}[{{ part.type }}={{ part.text }}]{% endfor %}{% endif %}|{% endfor %}`
	const loopVarTpl = `{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% for c in m.content %}{{ c.text }};{% endfor %}{% endfor %}`
	const stringTpl = `{% for message in messages %}{% if message.content is string %}{{ message.content }}{% endif %}{% endfor %}`
	if qwenTemplate(t).partsContent {
		t.Error("Qwen3's template detected as iterating content parts")
	}
	msgs := json.RawMessage(`[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null}]`)
	for src, want := range map[string]string{
		partsTpl:   "system:[text=s]|user:[text=a][text=b]|assistant:|",
		loopVarTpl: "a;b;",
		stringTpl:  "sa\nb",
	} {
		tpl, err := Parse(src, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tpl.Render(Input{Messages: msgs})
		if err != nil || got != want {
			t.Errorf("%s:\n got %q (%v)\nwant %q", src, got, err, want)
		}
	}
}
