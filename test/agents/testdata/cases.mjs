// The three Agents SDK cases test/agents runs, over whichever model the
// caller gives: a function tool, a structured output, and a handoff to a
// sub-agent on childModel (its calls carry the parent-session header).
import { Agent, run, tool } from '@openai/agents';
import { z } from 'zod';
import { attempt } from './record.mjs';

// Agents of one application share a long instruction prefix (whole 64-token
// blocks), as agent frameworks re-send their system prompt.
const shared = Array.from({ length: 200 }, (_, i) => `rule-${i}`).join(' ');

export async function runCases(out, parentModel, childModel) {
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
  // 1. A function tool: the model calls it, the SDK runs it, the model answers.
  const weatherAgent = new Agent({ name: 'Weather agent', instructions: `${shared}\nYou answer weather questions with get_weather.`,
    model: parentModel, tools: [getWeather] });
  await attempt(out, 'tool', async () => {
    const r = await run(weatherAgent, 'What is the weather in Paris? Use get_weather.');
    return { runs: toolRuns, final: r.finalOutput };
  });

  // 2. A structured output: the answer must parse against the schema.
  const Report = z.object({ city: z.string(), temperature_c: z.number(), conditions: z.enum(['sunny', 'cloudy', 'rain']), tags: z.array(z.string()) });
  const reportAgent = new Agent({ name: 'Report agent', instructions: `${shared}\nYou write weather reports.`, model: parentModel, outputType: Report });
  await attempt(out, 'structured', async () => {
    const r = await run(reportAgent, 'Write the weather report for Paris.');
    return { final: r.finalOutput, valid: Report.safeParse(r.finalOutput).success };
  });

  // 3. A handoff: the triage agent transfers to a sub-agent, whose calls go
  // out with the parent-session header (its own client).
  const researchAgent = new Agent({ name: 'Research agent', instructions: `${shared}\nYou research the question you are handed.`, model: childModel });
  const triageAgent = Agent.create({ name: 'Triage agent', instructions: `${shared}\nYou hand research questions to the research agent.`,
    model: parentModel, handoffs: [researchAgent] });
  await attempt(out, 'handoff', async () => {
    const r = await run(triageAgent, 'Please transfer_to_research_agent: why is the sky blue?');
    return { last_agent: r.lastAgent?.name ?? null, final: r.finalOutput };
  });
}
