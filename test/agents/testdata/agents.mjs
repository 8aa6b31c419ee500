// Drives the OpenAI Agents SDK against a tether edge over the chat
// completions API (OpenAIChatCompletionsModel): the cases of cases.mjs.
// Prints one JSON object on stdout with what the Go test (test/agents)
// asserts; every HTTP exchange is recorded with its x-tether-route header
// and usage.
//
// Environment: TETHER_URL (edge base URL, e.g. http://127.0.0.1:8000/v1),
// TETHER_MODEL, TETHER_PARENT_HEADER.
import { OpenAIChatCompletionsModel, setTracingDisabled } from '@openai/agents';
import OpenAI from 'openai';
import { calls, recordingFetch } from './record.mjs';
import { runCases } from './cases.mjs';

setTracingDisabled(true);

const baseURL = process.env.TETHER_URL;
const model = process.env.TETHER_MODEL ?? 'tether-sim';
const parentHeader = process.env.TETHER_PARENT_HEADER ?? 'X-Dynamo-Parent-Session-ID';

function client(who, headers) {
  return new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, defaultHeaders: headers, fetch: recordingFetch(who, true) });
}

const parentModel = new OpenAIChatCompletionsModel(client('parent', { 'x-session-id': 'agents-parent' }), model);
const childModel = new OpenAIChatCompletionsModel(client('child', { 'x-session-id': 'agents-child', [parentHeader]: 'agents-parent' }), model);
const out = {};
await runCases(out, parentModel, childModel);
out.calls = calls;
console.log(JSON.stringify(out));
