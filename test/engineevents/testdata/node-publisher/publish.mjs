// An independent publisher of vLLM-format KV cache events, for tether's
// tests (test/engineevents): the same protocol as vLLM's ZmqEventPublisher
// (vllm/distributed/kv_events.py), written against the npm packages
// zeromq and @msgpack/msgpack rather than tether's Go code.
//
//   node publish.mjs [map|array]
//
// Binds a PUB socket and a ROUTER replay socket on 127.0.0.1 and prints
// {"endpoint": ..., "replay": ...} as one JSON line. Then reads one command
// per stdin line and publishes it as one KVEventBatch:
//
//   {"dp": 1, "events": [
//     {"type": "stored", "hashes": [1, {"bytes": "ab01"}], "parent": 7 | null,
//      "tokens": [..], "block_size": 16},
//     {"type": "removed", "hashes": [...]},
//     {"type": "cleared"}]}
//
// Layout "map" encodes msgspec structs as maps tagged by "type" (current
// vLLM), "array" as array_like structs (SGLang, earlier vLLM). Frames are
// [topic "", 8-byte big-endian sequence from 0, payload]; a replay request
// ["", start] on the ROUTER socket gets every buffered batch from start and
// then the end marker (sequence -1, empty payload). Exits when stdin closes.
import * as readline from "node:readline";
import { encode } from "@msgpack/msgpack";
import * as zmq from "zeromq";

const layout = process.argv[2] === "array" ? "array" : "map";
const pub = new zmq.Publisher();
const router = new zmq.Router();
await pub.bind("tcp://127.0.0.1:0");
await router.bind("tcp://127.0.0.1:0");

const buffer = []; // [seq (BigInt), payload], bounded like vLLM's buffer_steps
const bufferSteps = 10000;
let nextSeq = 0n;

function seqFrame(n) {
  const b = Buffer.alloc(8);
  b.writeBigInt64BE(n);
  return b;
}

function hash(h) {
  if (h !== null && typeof h === "object" && "bytes" in h) {
    return Buffer.from(h.bytes, "hex");
  }
  return h;
}

function encodeEvent(e) {
  const hashes = (e.hashes || []).map(hash);
  switch (e.type) {
    case "stored": {
      const parent = e.parent === undefined || e.parent === null ? null : hash(e.parent);
      if (layout === "array") {
        return ["BlockStored", hashes, parent, e.tokens, e.block_size, null, "GPU", null];
      }
      return {
        type: "BlockStored", block_hashes: hashes, parent_block_hash: parent,
        token_ids: e.tokens, block_size: e.block_size, lora_id: null, medium: "GPU", lora_name: null,
      };
    }
    case "removed":
      return layout === "array" ? ["BlockRemoved", hashes, "GPU"] : { type: "BlockRemoved", block_hashes: hashes, medium: "GPU" };
    case "cleared":
      return layout === "array" ? ["AllBlocksCleared"] : { type: "AllBlocksCleared" };
  }
  throw new Error(`unknown event type ${e.type}`);
}

function encodeBatch(cmd) {
  const ts = Date.now() / 1000;
  const events = (cmd.events || []).map(encodeEvent);
  const dp = cmd.dp === undefined ? null : cmd.dp;
  if (layout === "array") {
    return encode(dp === null ? [ts, events] : [ts, events, dp]);
  }
  const batch = { ts, events };
  if (dp !== null) batch.data_parallel_rank = dp;
  return encode(batch);
}

async function serveReplay() {
  for await (const [id, , start] of router) {
    if (!start || start.length !== 8) continue;
    const from = start.readBigUInt64BE();
    for (const [seq, payload] of buffer) {
      if (seq >= from) await router.send([id, "", seqFrame(seq), payload]);
    }
    await router.send([id, "", seqFrame(-1n), ""]);
  }
}
serveReplay().catch(() => {});

console.log(JSON.stringify({ endpoint: pub.lastEndpoint, replay: router.lastEndpoint }));

const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) {
  if (line.trim() === "") continue;
  const payload = Buffer.from(encodeBatch(JSON.parse(line)));
  const seq = nextSeq++;
  buffer.push([seq, payload]);
  if (buffer.length > bufferSteps) buffer.shift();
  await pub.send(["", seqFrame(seq), payload]);
}
pub.close();
router.close();
process.exit(0);
