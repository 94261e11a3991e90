// e2e_nak_backoff: a channel's backoff list applies to a plain -NAK (no delay): with backoff
// [1s, 3s] the first NAK redelivers after ~1 s, the second after ~3 s, never earlier; without a
// backoff list, nak_delay is the delay of a plain NAK; and under max_ack_pending 1 a message
// waiting out its NAK delay does not hold the slot: the other messages flow meanwhile.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, SLOW } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert, assertNoConsumerErrors } from "./lib/check.mjs";

// Both clocks (the bridge's monotonic ms, the test's Date.now) truncate to whole ms: an arrival
// can look up to 2 ms early. Anything earlier than that is a real early redelivery.
const TRUNC_MS = 2;
const LATE_MS = 1500 * SLOW;

test("e2e_nak_backoff", async (ctx) => {
  const st = await startStack(ctx);
  const channels = [
    // ack_wait long: every redelivery here is caused by a NAK, not by a timeout.
    { name: "orders", subjects: ["orders.>"], deliver_prefix: "q.orders", backoff: ["1s", "3s"] },
    { name: "nd", subjects: ["nd.>"], deliver_prefix: "q.nd", backoff: [], nak_delay: "2s" },
    { name: "one", subjects: ["one.>"], deliver_prefix: "q.one", backoff: ["3s"], max_ack_pending: 1 },
  ];
  const bridge = await st.bridge({ name: "nakbo", defaults: { max_deliver: 5, ack_wait: "60s" }, channels }).start();
  const nc = await natsConnect(ctx, st.nats.url);

  // 1) backoff [1s, 3s]: plain NAK of deliveries 1 and 2, ack of the third.
  const bo = new Consumer(nc, "q.orders.w", { ackMode: (m, rec) => (rec.delivered < 3 ? "-NAK" : "+ACK") });
  // 2) no backoff list, nak_delay 2s: plain NAK of delivery 1, ack of the second.
  const nd = new Consumer(nc, "q.nd.w", { ackMode: (m, rec) => (rec.delivered < 2 ? "-NAK" : "+ACK") });
  // 3) max_ack_pending 1: the first message delivered is NAKed (backoff 3s), every other one acked.
  let first = null;
  const one = new Consumer(nc, "q.one.w", {
    ackMode: (m, rec) => {
      if (first === null) first = rec.id;
      return rec.id === first && rec.delivered === 1 ? "-NAK" : "+ACK";
    },
  });
  await nc.flush();

  const boMsgs = [0, 1, 2].map((i) => makeMsg("bo", i, "orders.x"));
  const ndMsgs = [0, 1].map((i) => makeMsg("nd", i, "nd.x"));
  const oneMsgs = Array.from({ length: 10 }, (_, i) => makeMsg("one", i, "one.x"));
  const t0 = Date.now();
  for (const set of [boMsgs, ndMsgs, oneMsgs]) {
    const res = await publishAll(nc, set, { concurrency: 16 });
    assert.equal(res.acked.size, set.length);
  }

  // max_ack_pending 1: the 9 others are delivered (and acked) while the NAKed one waits its 3 s.
  await one.waitUnique(oneMsgs.length, 20_000 * SLOW);
  await waitFor(() => (one.check(), one.records.length >= oneMsgs.length + 1), { timeout: 20_000 * SLOW, what: "the NAKed message's redelivery on q.one.w" });
  const oneRecs = one.records;
  const firstRecs = oneRecs.filter((r) => r.id === first);
  assert.equal(firstRecs.length, 2, "the NAKed message is delivered twice");
  const redeliveredAt = firstRecs[1].at;
  const othersDone = oneRecs.filter((r) => r.id !== first).map((r) => r.at);
  ctx.log(`max_ack_pending 1: others delivered ${Math.max(...othersDone) - firstRecs[0].at} ms after the NAK, the NAKed one redelivered after ${redeliveredAt - firstRecs[0].at} ms`);
  assert.ok(redeliveredAt - firstRecs[0].at >= 3000 - TRUNC_MS, "NAKed message not redelivered before its backoff");
  for (const at of othersDone)
    assert.ok(at < redeliveredAt, "every other message flowed while the NAKed one waited (it held no max_ack_pending slot)");

  // backoff [1s, 3s]
  for (const m of boMsgs) await waitFor(() => (bo.check(), (bo.counts.get(m.id) || 0) >= 3), { timeout: 20_000 * SLOW, what: `3 deliveries of ${m.id}` });
  for (const m of boMsgs) {
    const rs = bo.records.filter((r) => r.id === m.id);
    assert.deepEqual(rs.map((r) => r.delivered), [1, 2, 3], `delivery counts of ${m.id}`);
    const d1 = rs[1].at - rs[0].at, d2 = rs[2].at - rs[1].at;
    ctx.log(`${m.id}: redelivered after ${d1} ms then ${d2} ms`);
    assert.ok(d1 >= 1000 - TRUNC_MS, `first NAK of ${m.id} redelivered after ${d1} ms < 1 s`);
    assert.ok(d1 <= 1000 + LATE_MS, `first NAK of ${m.id} redelivered after ${d1} ms`);
    assert.ok(d2 >= 3000 - TRUNC_MS, `second NAK of ${m.id} redelivered after ${d2} ms < 3 s`);
    assert.ok(d2 <= 3000 + LATE_MS, `second NAK of ${m.id} redelivered after ${d2} ms`);
  }

  // nak_delay 2s (no backoff list)
  for (const m of ndMsgs) await waitFor(() => (nd.check(), (nd.counts.get(m.id) || 0) >= 2), { timeout: 20_000 * SLOW, what: `2 deliveries of ${m.id}` });
  for (const m of ndMsgs) {
    const rs = nd.records.filter((r) => r.id === m.id);
    const d = rs[1].at - rs[0].at;
    ctx.log(`${m.id}: nak_delay redelivery after ${d} ms`);
    assert.ok(d >= 2000 - TRUNC_MS && d <= 2000 + LATE_MS, `nak_delay redelivery of ${m.id} after ${d} ms`);
  }

  for (const ch of ["orders", "nd", "one"]) await waitBacklog(nc, ch, 0, 15_000 * SLOW);
  assertNoConsumerErrors([bo, nd, one]);
  ctx.log(`total ${Date.now() - t0} ms`);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
});
