// e2e_js_modern_client: the Node workers of README.md ("JetStream API"), run as they are written
// there: the test takes each ```js block from README.md, changes only the server address, appends
// its own `handle` (the user's business function: it records each message with the line of the
// worker that handed it over, and fails one message once) and runs it as a process.
// - @nats-io/jetstream 3.x with @nats-io/transport-node: jsm.streams.info (subjects, workqueue,
//   backlog), jsm.consumers.add, js.publish with a msgID, consumers.get + info (num_pending),
//   next(), fetch({max_messages, expires}), consume(); m.ack() and m.nak(5000): every message
//   handled and acked once, the failed one again after >= 5 s with deliveryCount 2; SIGTERM stops
//   consume() and the worker exits 0.
// - npm nats 2.29: the same consumer through nc.jetstream().consumers.get(...).consume(), started
//   after the first worker stopped: the pull request that worker left waiting is dropped with it
//   (its inbox has no subscriber), so each new message reaches the new worker at once, on its
//   first attempt (not after ack_wait in a dead inbox).
import fs from "node:fs";
import path from "node:path";
import { spawn } from "node:child_process";
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, metricValue } from "./lib/stack.mjs";
import { natsConnect, makeMsg, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

const HERE = path.dirname(new URL(import.meta.url).pathname);
const README = path.resolve(HERE, "..", "..", "README.md");

/** The ```js block of README.md whose first line is `first`. */
function readmeBlock(first) {
  const blocks = [...fs.readFileSync(README, "utf8").matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);
  const hit = blocks.filter((b) => b.split("\n")[0] === first);
  assert.equal(hit.length, 1, `README.md has one js block starting "${first}"`);
  return hit[0];
}

// The test's handle(m): one JSON line per call (id, attempt, time, the worker line that called).
const HANDLE = `
async function handle(m) {
  const id = m.headers?.get("X-Id") || new TextDecoder().decode(m.data);
  const at = /worker\\.mjs:(\\d+):/.exec(new Error().stack.split("\\n").slice(3).join("\\n"));
  process.stdout.write("H " + JSON.stringify({ id, dc: m.info.deliveryCount, t: Date.now(),
    line: at ? Number(at[1]) : 0, subj: m.headers?.get("Fluxon-Subject") ?? "" }) + "\\n");
  if (id === process.env.FAIL_ID && m.info.deliveryCount === 1) throw new Error("handle failed once");
}
`;

function runWorker(ctx, name, code, env) {
  const dir = path.join(ctx.dir, name);
  fs.mkdirSync(dir, { recursive: true });
  fs.symlinkSync(path.join(HERE, "node_modules"), path.join(dir, "node_modules"));
  const file = path.join(dir, "worker.mjs");
  fs.writeFileSync(file, code);
  const p = spawn(process.execPath, [file], { cwd: dir, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  const w = { out: "", err: "", lines: [], handled: [], exit: null };
  w.exited = new Promise((res) => p.on("exit", (code2, sig) => { w.exit = { code: code2, sig }; res(w.exit); }));
  p.stdout.on("data", (b) => {
    w.out += b;
    const parts = w.out.split("\n");
    w.out = parts.pop();
    for (const l of parts) {
      w.lines.push(l);
      if (l.startsWith("H ")) w.handled.push(JSON.parse(l.slice(2)));
    }
  });
  p.stderr.on("data", (b) => { w.err += b; });
  w.stop = () => { if (!w.exit) p.kill("SIGTERM"); return w.exited; };
  ctx.defer(async () => { if (!w.exit) { p.kill("SIGKILL"); await w.exited; } });
  ctx.onFailure(() => `---- ${name} stdout:\n${w.lines.join("\n")}\n---- ${name} stderr:\n${w.err.slice(-3000)}`);
  return w;
}

test("e2e_js_modern_client", async (ctx) => {
  const st = await startStack(ctx);
  const b = await st.bridge({ name: "m1" }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const server = st.nats.url.replace(/^nats:\/\//, "");

  // @nats-io/jetstream 3.x
  const N = 30;
  let res = await publishAll(nc, Array.from({ length: N }, (_, i) => makeMsg("mc", i, "orders.mc")));
  assert.equal(res.acked.size, N);
  await waitBacklog(nc, "orders", N);
  const src = readmeBlock("// worker.mjs: @nats-io/jetstream 3.x");
  assert.equal(src.split('"127.0.0.1:4222"').length, 2, "one server address in the README code");
  const code = src.replace('"127.0.0.1:4222"', JSON.stringify(server)) + HANDLE;
  const lineOf = (needle) => {
    const i = code.split("\n").findIndex((l) => l.includes(needle));
    assert.ok(i >= 0, `README worker has ${needle}`);
    return i + 1;
  };
  const L_NEXT = lineOf("if (first) await work(first)");
  const L_FETCH = lineOf("c.fetch({ max_messages: 10");
  const L_CONSUME = lineOf("for await (const m of msgs)");
  const w = runWorker(ctx, "modern", code, { FAIL_ID: "mc-0" });
  const total = N + 1; // and "hello" from the worker's own publish
  await waitFor(() => new Set(w.handled.filter((h) => !(h.id === "mc-0" && h.dc === 1)).map((h) => h.id)).size === total || w.exit,
    { timeout: 60_000, what: `${total} messages handled by the @nats-io/jetstream worker (${w.handled.length} so far)` });
  assert.equal(w.exit, null, `worker still running: ${w.err.slice(-2000)}`);
  ctx.log(`@nats-io/jetstream worker: ${w.handled.length} handled`);
  await waitBacklog(nc, "orders", 0, 20_000); // every ack committed
  assert.equal((await w.stop()).code, 0, `worker exit on SIGTERM: ${JSON.stringify(w.exit)} ${w.err.slice(-2000)}`);

  const out = w.lines.join("\n");
  assert.match(out, new RegExp(`^stream orders: orders\\.> workqueue, backlog ${N}$`, "m"), "jsm.streams.info");
  assert.match(out, /^published: orders seq \d+ duplicate false$/m, "js.publish PubAck");
  assert.match(out, new RegExp(`^consumer workers: ${total} pending, 0 unacked$`, "m"), "consumer info");
  const ids = w.handled.map((h) => h.id);
  assert.equal(ids.length, total + 1, `each message once, mc-0 twice: ${ids}`);
  assert.equal(new Set(ids).size, total, "no other duplicate");
  assert.ok(ids.includes("hello"), "the worker's own publish consumed");
  const byLine = (l) => w.handled.filter((h) => h.line === l).length;
  assert.equal(byLine(L_NEXT), 1, `next(): one message (lines: ${w.handled.map((h) => h.line)})`);
  assert.equal(byLine(L_FETCH), 10, "fetch({max_messages: 10}): ten");
  assert.equal(byLine(L_CONSUME), total + 1 - 11, "consume(): the rest and the redelivery");
  const failed = w.handled.filter((h) => h.id === "mc-0");
  assert.deepEqual(failed.map((h) => h.dc), [1, 2], "m.nak(5000): delivered again, deliveryCount 2");
  assert.ok(failed[1].t - failed[0].t >= 4900, `not before the NAK delay: ${failed[1].t - failed[0].t} ms`);
  assert.ok(w.handled.filter((h) => h.id !== "hello").every((h) => h.subj === "orders.mc"), "Fluxon-Subject");

  // npm nats 2.29: same consumer, nc.jetstream().consumers.get(...).consume()
  const M = 10;
  res = await publishAll(nc, Array.from({ length: M }, (_, i) => makeMsg("old", i, "orders.old")));
  assert.equal(res.acked.size, M);
  const src2 = readmeBlock("// worker.mjs: npm nats 2.29");
  assert.equal(src2.split('"127.0.0.1:4222"').length, 2, "one server address in the README code");
  const w2 = runWorker(ctx, "nats229", src2.replace('"127.0.0.1:4222"', JSON.stringify(server)) + HANDLE, { FAIL_ID: "" });
  await waitFor(() => new Set(w2.handled.map((h) => h.id)).size === M || w2.exit,
    { timeout: 60_000, what: `${M} messages handled by the nats 2.29 worker` });
  assert.equal(w2.exit, null, `worker still running: ${w2.err.slice(-2000)}`);
  ctx.log(`nats 2.29 worker: ${w2.handled.length} handled, attempts ${w2.handled.map((h) => h.dc)}`);
  await waitBacklog(nc, "orders", 0, 20_000);
  assert.equal((await w2.stop()).code, 0, `worker exit on SIGTERM: ${w2.err.slice(-2000)}`);
  assert.equal(w2.handled.length, M, "each once");
  // the first worker's last pull request died with it: none of these went to its inbox
  assert.ok(w2.handled.every((h) => h.dc === 1), `each on its first attempt: ${w2.handled.map((h) => h.dc)}`);

  ctx.log("nats 2.29 worker stopped");
  const ms = await b.metrics();
  assert.equal(metricValue(ms, "fluxon_acked_total", { channel: "orders" }), total + M, "every message acked once");
  const ex = await b.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
}, { timeout: 240_000 });
