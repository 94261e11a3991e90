// e2e_pull_consumer_survives_restart: a pull consumer's durable config and its backlog survive
// kill -9 of the bridge holding it. Bridge r1 serves 10 of 30 messages to a pull request; 5 are
// acked, 5 are left unacked; r1 is killed with SIGKILL and r2 started: the consumer's stored
// config is there (max_deliver 7 as given), and pulls through r2 get the other 25 (the 5 unacked
// ones again, marked as their 2nd delivery), never an acked one; the backlog empties. Then r1 is
// started again beside r2: pull requests go to either bridge (one queue group) and 20 new
// messages are all served, each once, by both bridges' claims. Last, messages a worker left
// unacked on a claim that gets no more requests are released after ack_wait and served again.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, metricValue } from "./lib/stack.mjs";
import { natsConnect, makeMsg, publishAll, waitBacklog, parseBody } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

const NEXT = "$JS.API.CONSUMER.MSG.NEXT.orders.rs";

test("e2e_pull_consumer_survives_restart", async (ctx) => {
  const st = await startStack(ctx);
  const defaults = { ttl_seconds: 3 };
  const r1 = st.bridge({ name: "r1", defaults });
  await r1.start();
  const nc = await natsConnect(ctx, st.nats.url);
  const jsm = await nc.jetstreamManager();
  await jsm.consumers.add("orders", { durable_name: "rs", ack_policy: "explicit", ack_wait: 4e9, max_deliver: 7 });

  // One pull request: its messages (and their delivered counts from the $JS.ACK reply) until a
  // terminal status or the batch is full.
  let n = 0;
  const pull = async (batch, expiresMs) => {
    const inbox = `_INBOX.rs${Date.now()}.${n++}`;
    const sub = nc.subscribe(inbox);
    const out = [];
    const timer = setTimeout(() => sub.unsubscribe(), expiresMs + 5000);
    nc.publish(NEXT, JSON.stringify({ batch, expires: expiresMs * 1e6 }), { reply: inbox });
    for await (const m of sub) {
      const code = m.headers?.code || 0;
      if (code === 100) continue;
      if (code) break;
      out.push({ id: parseBody(m.data).id, delivered: Number(m.reply.split(".")[6]), m });
      if (out.length === batch) break;
    }
    clearTimeout(timer);
    sub.unsubscribe();
    return out;
  };

  const N = 30;
  let res = await publishAll(nc, Array.from({ length: N }, (_, i) => makeMsg("rs", i, "orders.rs")));
  assert.equal(res.acked.size, N);
  await waitBacklog(nc, "orders", N);
  const first = await pull(10, 5000);
  assert.equal(first.length, 10, "r1 served a batch of 10");
  const acked = new Set(), unacked = new Set();
  first.forEach((x, i) => {
    if (i < 5) {
      x.m.respond(new Uint8Array(0));
      acked.add(x.id);
    } else {
      unacked.add(x.id);
    }
  });
  await waitFor(async () => (await jsm.consumers.info("orders", "rs")).num_ack_pending === 5, { timeout: 10_000, what: "5 awaiting their ack on r1" });
  await waitBacklog(nc, "orders", N - 5);

  const ex = await r1.kill9();
  ctx.log(`r1 killed: ${JSON.stringify(ex)}`);
  const r2 = st.bridge({ name: "r2", defaults });
  await r2.start();
  const ci = await jsm.consumers.info("orders", "rs");
  assert.equal(ci.config.max_deliver, 7, "the durable config survived (etcd)");
  assert.equal(ci.config.ack_wait, 4e9);

  const t0 = Date.now();
  const seen = new Map();
  while (seen.size < N - 5 && Date.now() - t0 < 60_000) {
    for (const x of await pull(10, 2000)) {
      assert.ok(!acked.has(x.id), `acked ${x.id} came back`);
      if (unacked.has(x.id)) assert.equal(x.delivered, 2, `${x.id}: its 2nd delivery`);
      seen.set(x.id, (seen.get(x.id) || 0) + 1);
      x.m.respond(new Uint8Array(0));
    }
  }
  ctx.log(`through r2: ${seen.size} distinct in ${Date.now() - t0} ms`);
  assert.equal(seen.size, N - 5, "every message not acked before the crash, through r2");
  for (const id of unacked) assert.ok(seen.has(id), `unacked ${id} redelivered`);
  await waitBacklog(nc, "orders", 0, 20_000);

  // Two bridges: pulls go to either; both serve.
  await r1.start();
  const M = 20;
  const w0 = Date.now();
  const got = new Map();
  let stop = false;
  const workers = [0, 1, 2, 3].map(async () => {
    while (!stop && Date.now() - w0 < 60_000) {
      for (const x of await pull(1, 1000)) {
        got.set(x.id, (got.get(x.id) || 0) + 1);
        x.m.respond(new Uint8Array(0));
      }
      if (got.size >= M) stop = true;
    }
  });
  // both bridges hold a ready pull claim before the publish
  await waitFor(async () => {
    const a = metricValue(await r1.metrics(), "fluxon_claims", { channel: "orders" }) || 0;
    const b = metricValue(await r2.metrics(), "fluxon_claims", { channel: "orders" }) || 0;
    return a >= 1 && b >= 1;
  }, { timeout: 20_000, what: "a pull claim on each bridge" });
  res = await publishAll(nc, Array.from({ length: M }, (_, i) => makeMsg("rs2", i, "orders.rs2")), { concurrency: 1 });
  assert.equal(res.acked.size, M);
  await Promise.all(workers);
  assert.equal(got.size, M, `all ${M} served (got ${got.size})`);
  assert.ok([...got.values()].every((c) => c === 1), "each once");
  const d1 = metricValue(await r1.metrics(), "fluxon_delivered_total", { channel: "orders" }) || 0;
  const d2 = metricValue(await r2.metrics(), "fluxon_delivered_total", { channel: "orders" }) || 0;
  ctx.log(`deliveries: r1 ${d1}, r2 ${d2} (r2 also served the 25 after the crash)`);
  assert.ok(d1 >= 1, "r1 served pulls");
  assert.ok(d2 > N - 5, "r2 served pulls");
  await waitBacklog(nc, "orders", 0, 20_000);

  // A worker that leaves with messages unacked, on a bridge that then gets no pull request: the
  // claim is released once their ack_wait (4 s) passed without any request or ack, so another
  // bridge's claim adopts them and serves them (here: the same one, r1 stopped).
  const s1 = await r1.stop();
  assert.equal(s1.code, 0);
  res = await publishAll(nc, [0, 1, 2].map((i) => makeMsg("rs3", i, "orders.rs3")));
  assert.equal(res.acked.size, 3);
  const left = await pull(3, 5000);
  assert.equal(left.length, 3, "3 delivered, never acked");
  await waitFor(() => /claim pull orders\.rs: no pull request for \d+ ms: releasing \(3 unacked\)/.test(r2.log()),
    { timeout: 20_000, what: "the idle pull claim released with its 3 unacked" });
  const back = new Map();
  const b0 = Date.now();
  while (back.size < 3 && Date.now() - b0 < 20_000)
    for (const x of await pull(3, 2000)) {
      back.set(x.id, x.delivered);
      x.m.respond(new Uint8Array(0));
    }
  assert.deepEqual([...back.values()], [2, 2, 2], "the 3 again, as their 2nd delivery");
  await waitBacklog(nc, "orders", 0, 20_000);
  for (const b of [r2]) {
    const e = await b.stop();
    assert.equal(e.code, 0, `bridge exit ${JSON.stringify(e)}`);
  }
}, { timeout: 240_000 });
