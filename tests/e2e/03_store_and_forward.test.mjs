// e2e_store_and_forward: publish with no subscriber (with and without a reply subject; the admin
// API shows the backlog), subscribe
// later (after a clean restart of the bridge, within the TTL): all messages arrive, exactly once,
// and the backlog drains to 0. The store is bounded by
// capacity: on a channel with capacity 5 the publishes beyond it get a 503 PubAck at once (JetStream's
// err_code 10077, "maximum messages exceeded") and are not stored; exactly the acked ones are
// delivered later.
import { test } from "./lib/runner.mjs";
import { startStack } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog, channelInfo, readyCount } from "./lib/client.mjs";
import { assert, assertSameSet, assertNoDuplicates, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_store_and_forward", async (ctx) => {
  const st = await startStack(ctx);
  const TINY = 5;
  const bridge = await st.bridge({
    name: "saf",
    channels: [
      { name: "orders", subjects: ["orders.>"], deliver_prefix: "q.orders" },
      { name: "tiny", subjects: ["tiny.>"], deliver_prefix: "q.tiny", capacity: TINY },
    ],
  }).start();
  const nc = await natsConnect(ctx, st.nats.url);

  const N = 500;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("saf", i, `orders.region${i % 5}.created`));
  const res = await publishAll(nc, msgs, { concurrency: 64 });
  assert.equal(res.acked.size, N, `acked ${res.acked.size}/${N}; first failure: ${JSON.stringify([...res.failed.values()][0])}`);

  // Plain publishes without a reply subject are captured too.
  const P = 100;
  const plain = Array.from({ length: P }, (_, i) => makeMsg("saf", N + i, "orders.plain"));
  for (const m of plain) nc.publish(m.subject, m.data, { headers: m.headers });
  await nc.flush();
  msgs.push(...plain);

  // Nobody subscribed: everything is stored, nothing is claimed.
  const info = await waitBacklog(nc, "orders", N + P, 10_000);
  assert.equal(readyCount(info), 0, "no claim without a subscriber");
  const m0 = await bridge.metrics();
  ctx.log(`stored ${info.backlog}; sub-MPSCs ${info.sub_mpscs ? info.sub_mpscs.length : "?"}`);

  // A clean restart of the bridge within the TTL (the durability horizon) keeps the stored messages.
  const ex0 = await bridge.stop();
  assert.equal(ex0.code, 0, `bridge exit ${JSON.stringify(ex0)}`);
  await bridge.start();
  await waitBacklog(nc, "orders", N + P, 10_000);

  const late = new Consumer(nc, "q.orders.late");
  await late.waitUnique(N + P, 30_000);
  await waitBacklog(nc, "orders", 0, 15_000);
  assertNoConsumerErrors([late]);
  assertSameSet(msgs.map((m) => m.id), [...late.counts.keys()], "late subscriber");
  assertNoDuplicates([late]);
  for (const r of late.records) {
    assert.equal(r.delivered, 1);
    assert.equal(r.fluxonSubject, r.origSubject);
  }
  // One bridge (one producer), one claim: FIFO, deliveries in storage (sequence) order.
  const seqs = late.records.map((r) => Number(r.seq));
  const outOfOrder = seqs.filter((q, i) => i > 0 && q <= seqs[i - 1]).length;
  assert.equal(outOfOrder, 0, `deliveries out of Fluxon-Seq order: ${outOfOrder}`);
  for (const [id, ack] of res.acked) assert.ok(late.counts.has(id) && ack.stream === "orders");
  assert.ok(m0.length > 0, "metrics rendered");

  // Bounded by capacity.
  const tmsgs = Array.from({ length: TINY + 3 }, (_, i) => makeMsg("tiny", i, "tiny.t"));
  const tres = await publishAll(nc, tmsgs, { concurrency: tmsgs.length, timeout: 15_000 });
  ctx.log(`tiny: acked ${tres.acked.size}, errors ${JSON.stringify([...tres.errCodes])}`);
  assert.equal(tres.acked.size, TINY, "publishes acked up to the capacity");
  assert.deepEqual([...tres.errCodes], [["503", 3]], "the rest answered 503 channel full");
  for (const r of tres.failed.values()) {
    assert.equal(r.error, "maximum messages exceeded", "JetStream's description for a full stream");
    assert.equal(r.reply.error.err_code, 10077, "JetStream's err_code for a full stream");
  }
  await waitBacklog(nc, "tiny", TINY);
  const tc = new Consumer(nc, "q.tiny.t");
  await tc.waitUnique(TINY, 20_000);
  await waitBacklog(nc, "tiny", 0);
  assertSameSet([...tres.acked.keys()], [...tc.counts.keys()], "capacity-bounded channel");
  assert.equal(tc.records.length, TINY);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  const after = await channelInfo(nc, "orders").catch((e) => ({ error: e.message }));
  ctx.log(`admin after the bridge stopped: ${JSON.stringify(after).slice(0, 120)}`);
  bridge.assertLogClean();
});
