// e2e_leaf_pubacks: with nats.leaf_pubacks the PubAcks go over the leaf connection: 2,000
// publishes with acks (no subscriber, so nothing else goes over the leaf) are all answered with
// distinct seqs, and nats-server's /leafz counts at least one message from the leaf per PubAck.
// Then the leaf user's publish rights are not the client connection's: with nats.leaf_pubacks off
// (the default), /leafz counts none (PubAcks on the client connection).
import { test } from "./lib/runner.mjs";
import { startStack, httpGet, waitFor } from "./lib/stack.mjs";
import { natsConnect, makeMsg, publishAll } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

async function leafInMsgs(nats) {
  const r = await httpGet(`${nats.monitorUrl}/leafz`, 2000);
  assert.equal(r.status, 200, "/leafz");
  return (r.json.leafs || []).reduce((s, l) => s + (l.in_msgs || 0), 0);
}

async function publishAcked(ctx, nc, tag, n) {
  const msgs = Array.from({ length: n }, (_, i) => makeMsg(tag, i, "orders.eu.new"));
  const res = await publishAll(nc, msgs, { concurrency: 128, timeout: 30_000 });
  assert.equal(res.failed.size, 0, `failed publishes: ${[...res.failed].slice(0, 5).map(([id, r]) => `${id}: ${r.error}`).join("; ")}`);
  assert.equal(res.acked.size, n);
  const seqs = new Set([...res.acked.values()].map((a) => a.seq));
  assert.equal(seqs.size, n, "PubAck seqs distinct");
}

test("e2e_leaf_pubacks", async (ctx) => {
  const st = await startStack(ctx);
  const N = 2000;
  const on = await st.bridge({ name: "lpa", config: (c) => { c.nats.leaf_pubacks = true; } }).start();
  await waitFor(async () => (await leafInMsgs(st.nats)) >= 0 && (await httpGet(`${st.nats.monitorUrl}/leafz`)).json.leafs.length === 1,
    { timeout: 10_000, what: "the bridge's leaf connection" });
  const nc = await natsConnect(ctx, st.nats.url, "pub");
  const before = await leafInMsgs(st.nats);
  await publishAcked(ctx, nc, "lpa", N);
  const after = await leafInMsgs(st.nats);
  ctx.log(`leaf_pubacks on: ${N} PubAcks, leaf in_msgs ${before} -> ${after}`);
  assert.ok(after - before >= N, `PubAcks over the leaf: /leafz in_msgs grew by ${after - before}, want >= ${N}`);
  await on.stop();

  const off = await st.bridge({ name: "lpb" }).start();
  await waitFor(async () => (await httpGet(`${st.nats.monitorUrl}/leafz`)).json.leafs.length === 1,
    { timeout: 10_000, what: "the second bridge's leaf connection" });
  const b0 = await leafInMsgs(st.nats);
  await publishAcked(ctx, nc, "lpb", N);
  const b1 = await leafInMsgs(st.nats);
  ctx.log(`leaf_pubacks off: ${N} PubAcks, leaf in_msgs ${b0} -> ${b1}`);
  assert.ok(b1 - b0 < N, `PubAcks over the client connection: /leafz in_msgs grew by ${b1 - b0}`);
  await off.stop();
});
