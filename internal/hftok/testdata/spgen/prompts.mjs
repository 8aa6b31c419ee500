// The prompts of the SentencePiece goldens: the byte-level set's kinds of
// text (languages, scripts, emoji, code, whitespace runs) and what a
// SentencePiece vocabulary adds — characters outside the vocabulary
// (byte fallback), Mistral's special tokens inside text, leading and
// trailing spaces that Metaspace and Prepend treat differently.
const base = [
  "Hello, my dog is cute",
  "The quick brown fox jumps over the lazy dog.",
  "I'm sure they'll say it's fine, but we've DON'T know.",
  "Bonjour, ça va ? Très bien, merci ! L'été est là.",
  "Größere Übungen für Äpfel und Öl — straße.",
  "Привет, как дела? Всё хорошо.",
  "你好，世界！今天天气很好。我们去公园吧。",
  "日本語のテキスト、カタカナとひらがな。東京タワー。",
  "한국어 문장입니다. 감사합니다!",
  "مرحبا بالعالم، كيف حالك؟",
  "नमस्ते दुनिया, आप कैसे हैं?",
  "Emoji: 🎉🚀👍🏽 👨‍👩‍👧‍👦 ❤️ 🇫🇷 🦀🦕🧬",
  "Rare: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ᚠᚢᚦᚨᚱᚲ ꙮ 𓀀𓁐 䨻齉",
  "Decomposed: cafe\u0301 nai\u0308ve",
  "Numbers: 1234567890 3.14159 1e-9 0x1F 2024-12-01",
  "func main() {\n\tfmt.Println(\"hello\")\n}\n",
  "def f(x):\n    return x ** 2  # square\n\n\nprint(f(3))\n",
  "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
  "a  b   c    d     e",
  "tabs\tand\t\ttabs",
  "line one\nline two\r\nline three\n\n\nline four",
  "   leading spaces",
  "trailing spaces   ",
  "\n\nleading newlines",
  "<s>[INST] What is the capital of France? [/INST] Paris.</s>",
  "x<s>y</s>z <unk> end",
  "Control: \u0001\u0002\u001f bell\u0007",
  "Zero width: a\u200bb\u200cc\u200dd",
  "Math: ∑_{i=1}^{n} i² = n(n+1)/2",
  "Quotes: “smart” ‘quotes’ «guillemets»",
  "Long word: supercalifragilisticexpialidocious",
  "\u00a0non-breaking\u00a0spaces\u2003em",
];
const variants = [(s) => s, (s) => " " + s, (s) => s + "\n", (s) => "User said: " + s, (s) => s + " " + s];
export const prompts = [];
for (const b of base) for (const v of variants) prompts.push(v(b));
prompts.push(("You are a careful coding agent. Use the tools and report what you changed.\n").repeat(30));
prompts.push("    ".repeat(40) + "indented");
prompts.push("🙂".repeat(50));
prompts.push(" ");
prompts.push("▁already▁has▁markers");
