// The OpenAI Agents SDK with its default model — the Responses API model
// (OpenAIResponsesModel) over the default client — against a tether edge:
// the cases of cases.mjs. Prints one JSON report on stdout.
//
// Environment: TETHER_URL (the edge's base URL with /v1), TETHER_MODEL (unset
// or empty: the agents name no model and run on the SDK's default model
// name), TETHER_PARENT_HEADER.
import { setTracingDisabled, setDefaultOpenAIClient, OpenAIResponsesModel, getDefaultModel } from '@openai/agents';
import OpenAI from 'openai';
import { calls, recordingFetch } from './record.mjs';
import { runCases } from './cases.mjs';

setTracingDisabled(true);
const baseURL = process.env.TETHER_URL;
const model = process.env.TETHER_MODEL || undefined;
const parentHeader = process.env.TETHER_PARENT_HEADER ?? 'X-Dynamo-Parent-Session-ID';

function client(who, headers) {
  return new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, defaultHeaders: headers, fetch: recordingFetch(who) });
}
// The default model is a model name: the SDK's default provider serves it
// with OpenAIResponsesModel over the default client.
setDefaultOpenAIClient(client('parent', { 'x-session-id': 'agents-responses-parent' }));
// The sub-agent's calls go out with the parent header: the same model
// class over its own client.
const childModel = new OpenAIResponsesModel(client('child', { 'x-session-id': 'agents-responses-child', [parentHeader]: 'agents-responses-parent' }), model ?? getDefaultModel());
const out = {};
await runCases(out, model, childModel);
out.calls = calls;
console.log(JSON.stringify(out));
