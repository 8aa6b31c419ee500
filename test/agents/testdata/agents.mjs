// Drives the OpenAI Agents SDK against a tether edge (chat completions API):
// a function tool, a structured output and a handoff to a sub-agent whose
// calls carry the parent-session header. Prints one JSON object on stdout
// with what the Go test (test/agents) asserts; every HTTP exchange is
// recorded with its x-tether-route header and usage.
//
// Environment: TETHER_URL (edge base URL, e.g. http://127.0.0.1:8000/v1),
// TETHER_MODEL, TETHER_PARENT_HEADER.
import { Agent, run, tool, OpenAIChatCompletionsModel, setTracingDisabled } from '@openai/agents';
import OpenAI from 'openai';
import { z } from 'zod';

setTracingDisabled(true);

const baseURL = process.env.TETHER_URL;
const model = process.env.TETHER_MODEL ?? 'tether-sim';
const parentHeader = process.env.TETHER_PARENT_HEADER ?? 'X-Dynamo-Parent-Session-ID';

const calls = [];

// A fetch that records each exchange: who asked (the session), the route
// the edge chose, and the usage the model reported.
function recordingFetch(who) {
  return async (url, init) => {
    const res = await fetch(url, init);
    const entry = { who, path: new URL(String(url)).pathname, status: res.status, route: res.headers.get('x-tether-route') };
    try {
      const body = await res.clone().json();
      entry.usage = body.usage ?? null;
      entry.finish = body.choices?.[0]?.finish_reason ?? null;
      entry.tool_calls = (body.choices?.[0]?.message?.tool_calls ?? []).map((c) => c.function.name);
    } catch (e) {
      entry.error = String(e);
    }
    calls.push(entry);
    return res;
  };
}

function client(who, headers) {
  return new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, defaultHeaders: headers, fetch: recordingFetch(who) });
}

const parentClient = client('parent', { 'x-session-id': 'agents-parent' });
const childClient = client('child', { 'x-session-id': 'agents-child', [parentHeader]: 'agents-parent' });
const parentModel = new OpenAIChatCompletionsModel(parentClient, model);
const childModel = new OpenAIChatCompletionsModel(childClient, model);

// Agents of one application share a long instruction prefix (whole 64-token
// blocks), as agent frameworks re-send their system prompt.
const shared = Array.from({ length: 200 }, (_, i) => `rule-${i}`).join(' ');

const toolRuns = [];
const getWeather = tool({
  name: 'get_weather',
  description: 'Current weather of a city.',
  parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => {
    toolRuns.push(city);
    return `sunny and 21C in ${city}`;
  },
});

const out = {};

// 1. A function tool: the model calls it, the SDK runs it, the model answers.
const weatherAgent = new Agent({
  name: 'Weather agent',
  instructions: `${shared}\nYou answer weather questions with get_weather.`,
  model: parentModel,
  tools: [getWeather],
});
// Each case records its error instead of stopping the others.
async function attempt(name, fn) {
  try {
    out[name] = await fn();
  } catch (e) {
    out[name] = { error: `${e?.name}: ${e?.message}` };
  }
}

await attempt('tool', async () => {
  const r = await run(weatherAgent, 'What is the weather in Paris? Use get_weather.');
  return { runs: toolRuns, final: r.finalOutput };
});

// 2. A structured output: the answer must parse against the schema.
const Report = z.object({
  city: z.string(),
  temperature_c: z.number(),
  conditions: z.enum(['sunny', 'cloudy', 'rain']),
  tags: z.array(z.string()),
});
const reportAgent = new Agent({
  name: 'Report agent',
  instructions: `${shared}\nYou write weather reports.`,
  model: parentModel,
  outputType: Report,
});
await attempt('structured', async () => {
  const r = await run(reportAgent, 'Write the weather report for Paris.');
  return { final: r.finalOutput, valid: Report.safeParse(r.finalOutput).success };
});

// 3. A handoff: the triage agent transfers to a sub-agent, whose calls go
// out with the parent-session header (its own client).
const researchAgent = new Agent({
  name: 'Research agent',
  instructions: `${shared}\nYou research the question you are handed.`,
  model: childModel,
});
const triageAgent = Agent.create({
  name: 'Triage agent',
  instructions: `${shared}\nYou hand research questions to the research agent.`,
  model: parentModel,
  handoffs: [researchAgent],
});
await attempt('handoff', async () => {
  const r = await run(triageAgent, 'Please transfer_to_research_agent: why is the sky blue?');
  return { last_agent: r.lastAgent?.name ?? null, final: r.finalOutput };
});

out.calls = calls;
console.log(JSON.stringify(out));
