// The OpenAI Agents SDK keeping its conversation on the server, against a
// tether edge: runs with conversationId (a conversation made with the
// openai client's conversations.create) and runs with an
// OpenAIConversationsSession (which makes its conversation, reads its
// items back and adds each turn's). Prints one JSON report on stdout.
//
// Environment: TETHER_URL (the edge's base URL with /v1), TETHER_MODEL.
import { Agent, run, setTracingDisabled, setDefaultOpenAIClient, OpenAIConversationsSession } from '@openai/agents';
import OpenAI from 'openai';
import { attempt, calls, recordingFetch } from './record.mjs';

setTracingDisabled(true);
const model = process.env.TETHER_MODEL ?? 'tether-sim';
const client = (who) => new OpenAI({ baseURL: process.env.TETHER_URL, apiKey: 'unused', maxRetries: 0, fetch: recordingFetch(who) });
setDefaultOpenAIClient(client('conversation'));
const rules = Array.from({ length: 120 }, (_, i) => `rule-${i}`).join(' ');
const agent = new Agent({ name: 'Travel agent', instructions: 'You plan trips.', model });

async function itemsOf(c, id) {
  const out = [];
  for await (const it of c.conversations.items.list(id, { order: 'asc' })) {
    out.push(`${it.type}:${it.role ?? ''}`);
  }
  return out;
}

const out = {};
await attempt(out, 'conversation_id', async () => {
  const c = client('conversation');
  const conv = await c.conversations.create({ items: [{ type: 'message', role: 'system', content: `House rules: ${rules}` }], metadata: { app: 'tether-test' } });
  const first = await run(agent, 'Plan a trip to Paris.', { conversationId: conv.id });
  const second = await run(agent, 'And back to Berlin?', { conversationId: conv.id });
  const retrieved = await c.conversations.retrieve(conv.id);
  return { id: conv.id, retrieved_id: retrieved.id, metadata: retrieved.metadata, first: first.finalOutput, second: second.finalOutput, items: await itemsOf(c, conv.id) };
});
await attempt(out, 'session', async () => {
  const session = new OpenAIConversationsSession({ client: client('session') });
  const first = await run(agent, `Plan a trip to Rome. ${rules}`, { session });
  const second = await run(agent, 'What did I ask for before?', { session });
  const history = await session.getItems();
  const id = await session.getSessionId();
  await session.clearSession();
  return { id, first: first.finalOutput, second: second.finalOutput, history: history.length };
});
out.calls = calls;
console.log(JSON.stringify(out));
