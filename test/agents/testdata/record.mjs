// A fetch that records each exchange of a client: who asked, the route the
// edge chose (x-tether-route), the answer's id and usage. Shared by the
// SDK scripts of test/agents.
export const calls = [];

// With chat, the answer's finish reason and tool calls are recorded too.
export function recordingFetch(who, chat = false) {
  return async (url, init) => {
    const res = await fetch(url, init);
    const entry = { who, path: new URL(String(url)).pathname, status: res.status, route: res.headers.get('x-tether-route') };
    if ((res.headers.get('content-type') ?? '').includes('json')) {
      try {
        const body = await res.clone().json();
        entry.id = body.id ?? null;
        entry.usage = body.usage ?? null;
        if (chat) {
          entry.finish = body.choices?.[0]?.finish_reason ?? null;
          entry.tool_calls = (body.choices?.[0]?.message?.tool_calls ?? []).map((c) => c.function.name);
        }
      } catch (e) {
        entry.error = String(e);
      }
    }
    calls.push(entry);
    return res;
  };
}

// attempt runs one case and records its result or its error instead of
// stopping the others.
export async function attempt(out, name, fn) {
  try {
    out[name] = await fn();
  } catch (e) {
    out[name] = { error: `${e?.name}: ${e?.message}` };
  }
}
