// The OpenAI Agents SDK with its default model — the Responses API model
// (OpenAIResponsesModel) over the default client — against a tether edge:
// a function tool, a structured output and a handoff to a sub-agent whose
// calls carry the parent-session header. Prints one JSON report on stdout.
//
// Environment: TETHER_URL (the edge's base URL with /v1), TETHER_MODEL,
// TETHER_PARENT_HEADER.
import { Agent, run, tool, setTracingDisabled, setDefaultOpenAIClient, OpenAIResponsesModel } from '@openai/agents';
import OpenAI from 'openai';
import { z } from 'zod';
import { calls, recordingFetch, attempt } from './record.mjs';

setTracingDisabled(true);
const baseURL = process.env.TETHER_URL;
const model = process.env.TETHER_MODEL ?? 'tether-sim';
const parentHeader = process.env.TETHER_PARENT_HEADER ?? 'X-Dynamo-Parent-Session-ID';

function client(who, headers) {
  return new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, defaultHeaders: headers, fetch: recordingFetch(who) });
}
// The default model is a model name: the SDK's default provider serves it
// with OpenAIResponsesModel over the default client.
setDefaultOpenAIClient(client('parent', { 'x-session-id': 'agents-responses-parent' }));
// The sub-agent's calls go out with the parent header: the same model
// class over its own client.
const childModel = new OpenAIResponsesModel(client('child', { 'x-session-id': 'agents-responses-child', [parentHeader]: 'agents-responses-parent' }), model);

const shared = Array.from({ length: 200 }, (_, i) => `rule-${i}`).join(' ');
const out = {};

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
const weatherAgent = new Agent({ name: 'Weather agent', instructions: `${shared}\nYou answer weather questions with get_weather.`, model, tools: [getWeather] });
await attempt(out, 'tool', async () => {
  const r = await run(weatherAgent, 'What is the weather in Paris? Use get_weather.');
  return { runs: toolRuns, final: r.finalOutput };
});

const Report = z.object({ city: z.string(), temperature_c: z.number(), conditions: z.enum(['sunny', 'cloudy', 'rain']), tags: z.array(z.string()) });
const reportAgent = new Agent({ name: 'Report agent', instructions: `${shared}\nYou write weather reports.`, model, outputType: Report });
await attempt(out, 'structured', async () => {
  const r = await run(reportAgent, 'Write the weather report for Paris.');
  return { final: r.finalOutput, valid: Report.safeParse(r.finalOutput).success };
});

const researchAgent = new Agent({ name: 'Research agent', instructions: `${shared}\nYou research the question you are handed.`, model: childModel });
const triageAgent = Agent.create({ name: 'Triage agent', instructions: `${shared}\nYou hand research questions to the research agent.`, model, handoffs: [researchAgent] });
await attempt(out, 'handoff', async () => {
  const r = await run(triageAgent, 'Please transfer_to_research_agent: why is the sky blue?');
  return { last_agent: r.lastAgent?.name ?? null, final: r.finalOutput };
});

out.calls = calls;
console.log(JSON.stringify(out));
