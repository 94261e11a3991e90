// e2e_nak_redelivery_and_dlq: NAKed messages come back with Fluxon-Delivered incremented; after
// max_deliver attempts they appear on a subscriber of q.orders-dlq.<name> with Fluxon-Dead-Reason;
// messages acked on first delivery are never redelivered nor dead-lettered; -NAK with a JSON delay
// (as JetStream clients send it) also redelivers.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, metricValue } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert, assertSameSet, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_nak_redelivery_and_dlq", async (ctx) => {
  const MAX = 3;
  const st = await startStack(ctx);
  // ack_wait long: every redelivery here is caused by a NAK, not by a timeout.
  const bridge = await st.bridge({ name: "nak", defaults: { max_deliver: MAX, ack_wait: "60s", backoff: ["100ms"] } }).start();
  const nc = await natsConnect(ctx, st.nats.url);

  // n % 3 == 0: always plain -NAK; n % 3 == 1: ack at once; n % 3 == 2: -NAK {"delay":50ms} once,
  // then ack on the second delivery.
  const N = 30;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("nak", i, "orders.retry"));
  const kind = (n) => n % 3;
  const worker = new Consumer(nc, "q.orders.w", {
    ackMode: (m, rec) => {
      if (kind(rec.n) === 0) return "-NAK";
      if (kind(rec.n) === 1) return "+ACK";
      return rec.delivered === 1 ? `-NAK {"delay":${50_000_000}}` : "+ACK";
    },
  });
  const dlq = new Consumer(nc, "q.orders-dlq.d");
  await nc.flush();

  const res = await publishAll(nc, msgs, { concurrency: 32 });
  assert.equal(res.acked.size, N);

  const dead = msgs.filter((m) => kind(m.n) === 0).map((m) => m.id);
  const delayed = msgs.filter((m) => kind(m.n) === 2);
  await dlq.waitUnique(dead.length, 30_000);
  await waitFor(() => delayed.every((m) => (worker.counts.get(m.id) || 0) >= 2), { timeout: 15_000, what: "NAK-with-delay redeliveries" });
  await waitBacklog(nc, "orders", 0, 15_000);
  await waitBacklog(nc, "orders-dlq", 0, 15_000);
  assertNoConsumerErrors([worker, dlq]);

  // Per-message delivery history on the worker claim.
  const hist = new Map();
  for (const r of worker.records) {
    if (!hist.has(r.id)) hist.set(r.id, []);
    hist.get(r.id).push(r.delivered);
  }
  for (const m of msgs) {
    const h = hist.get(m.id) || [];
    const want = kind(m.n) === 0 ? [1, 2, 3] : kind(m.n) === 1 ? [1] : [1, 2];
    assert.deepEqual(h, want, `Fluxon-Delivered sequence of ${m.id}`);
  }
  // Redeliveries carry the same data and headers.
  for (const r of worker.records) {
    assert.equal(r.xid, r.id);
    assert.equal(r.fluxonSubject, "orders.retry");
  }
  // The dead letters: exactly the always-NAKed set, once each, reason set, data intact.
  assertSameSet(dead, [...dlq.counts.keys()], "dead letters");
  assert.equal(dlq.records.length, dead.length, "each dead letter delivered once");
  for (const r of dlq.records) {
    assert.ok(r.deadReason && r.deadReason.length > 0, `Fluxon-Dead-Reason of ${r.id}`);
    assert.equal(r.xid, r.id, "publisher header kept on the dead letter");
    assert.equal(r.subject, "q.orders-dlq.d");
    assert.equal(r.channel, "orders-dlq", `Fluxon-Channel of dead letter ${r.id}`);
    assert.equal(r.fluxonSubject, "orders.retry", "original subject kept");
  }
  ctx.log(`dead reason example: ${dlq.records[0].deadReason}`);

  const ms = await bridge.metrics();
  const redelivered = metricValue(ms, "fluxon_redelivered_total", { channel: "orders" });
  const deadN = metricValue(ms, "fluxon_dead_lettered_total", { channel: "orders" });
  ctx.log(`metrics: redelivered ${redelivered} dead_lettered ${deadN}`);
  assert.equal(redelivered, dead.length * (MAX - 1) + delayed.length, "fluxon_redelivered_total");
  assert.equal(deadN, dead.length, "fluxon_dead_lettered_total");
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
});
