// The Anthropic SDK (as Claude Code talks) and the openai SDK's Responses
// API (as Codex talks) against a tether edge: messages.create,
// messages.stream, a tool round trip and countTokens; responses.create,
// responses.stream chained by previous_response_id, responses.retrieve and
// a background response cancelled. Prints one JSON report on stdout.
//
// Environment: TETHER_BASE (the edge's base URL, no /v1), TETHER_MODEL.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { calls, recordingFetch, attempt } from './record.mjs';

const base = process.env.TETHER_BASE;
const model = process.env.TETHER_MODEL ?? 'tether-sim';
const out = {};
const system = 'You are Claude Code. ' + Array.from({ length: 300 }, (_, i) => `rule-${i}`).join(' ');

const anthropic = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0,
  defaultHeaders: { 'x-claude-code-session-id': 'sdk-claude-session' }, fetch: recordingFetch('anthropic') });

await attempt(out, 'messages_create', async () => {
  const m = await anthropic.messages.create({ model, max_tokens: 8, system, messages: [{ role: 'user', content: 'hello there' }] });
  return { id: m.id, type: m.type, stop_reason: m.stop_reason, text: m.content.map((b) => b.text ?? '').join(''), usage: m.usage };
});

await attempt(out, 'messages_stream', async () => {
  const stream = anthropic.messages.stream({ model, max_tokens: 8, system,
    messages: [{ role: 'user', content: 'hello there' }, { role: 'assistant', content: 'hi' }, { role: 'user', content: 'tell me more' }] });
  const kinds = [];
  for await (const ev of stream) kinds.push(ev.type);
  const m = await stream.finalMessage();
  return { kinds, text: m.content.map((b) => b.text ?? '').join(''), stop_reason: m.stop_reason, usage: m.usage };
});

await attempt(out, 'tool_round_trip', async () => {
  const tools = [{ name: 'get_weather', description: 'weather of a city', input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
  const first = await anthropic.messages.create({ model, max_tokens: 64, system, tools, messages: [{ role: 'user', content: 'weather in Paris? use get_weather' }] });
  const use = first.content.find((b) => b.type === 'tool_use');
  if (!use) throw new Error('no tool_use block: ' + JSON.stringify(first.content));
  const second = await anthropic.messages.create({ model, max_tokens: 8, system, tools, messages: [
    { role: 'user', content: 'weather in Paris? use get_weather' },
    { role: 'assistant', content: first.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny, 21C' }] },
  ] });
  return { first_stop: first.stop_reason, tool: use.name, input: use.input, second_stop: second.stop_reason,
    second_text: second.content.map((b) => b.text ?? '').join('') };
});

await attempt(out, 'count_tokens', async () => {
  const c = await anthropic.messages.countTokens({ model, system, messages: [{ role: 'user', content: 'hello there' }] });
  return { input_tokens: c.input_tokens };
});

const openai = new OpenAI({ baseURL: base + '/v1', apiKey: 'unused', maxRetries: 0, fetch: recordingFetch('openai') });

await attempt(out, 'responses', async () => {
  const r1 = await openai.responses.create({ model, instructions: system, input: 'hello there', max_output_tokens: 8 });
  const stream = openai.responses.stream({ model, instructions: system, input: 'tell me more', previous_response_id: r1.id, max_output_tokens: 8 });
  const kinds = [];
  for await (const ev of stream) kinds.push(ev.type);
  const r2 = await stream.finalResponse();
  const got = await openai.responses.retrieve(r2.id);
  return { first_id: r1.id, first_text: r1.output_text, second_id: r2.id, second_previous: r2.previous_response_id, kinds,
    second_text: r2.output_text, second_usage: r2.usage, retrieved_id: got.id, retrieved_text: got.output_text };
});

await attempt(out, 'background_cancel', async () => {
  // An essay of 20,000 words takes the simulated engine half a minute at
  // the test's time scale: the cancel reaches it running, however slowly
  // this process is scheduled.
  const bg = await openai.responses.create({ model, input: 'write a very long essay of 20000 words', background: true, max_output_tokens: 20000 });
  const cancelled = await openai.responses.cancel(bg.id);
  const after = await openai.responses.retrieve(bg.id);
  return { created_status: bg.status, cancel_status: cancelled.status, retrieved_status: after.status, id: bg.id, cancelled_id: cancelled.id };
});

out.calls = calls;
console.log(JSON.stringify(out));
