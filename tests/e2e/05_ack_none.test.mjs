// e2e_ack_none: with ack "none" every message is delivered exactly once while the subscriber stays
// (Fluxon-Delivered 1, no redelivery, backlog drains without any ack, delivered metric = count),
// and nothing comes back for 3 x ack_wait after the backlog drained (the subscriber never acks).
import { test } from "./lib/runner.mjs";
import { startStack, metricValue, waitFor, SLOW } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitClaims, waitBacklog } from "./lib/client.mjs";
import { assert, assertSameSet, assertNoDuplicates, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_ack_none", async (ctx) => {
  const ACK_WAIT_MS = 1000;
  const st = await startStack(ctx);
  const bridge = await st.bridge({
    name: "none",
    channels: [{ name: "orders", subjects: ["orders.>"], deliver_prefix: "q.orders", ack: "none", ack_wait: `${ACK_WAIT_MS}ms` }],
  }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const subNc = await natsConnect(ctx, st.nats.url, "sub");
  // The consumer never responds; with ack_wait 1 s an explicit channel would redeliver.
  const c = new Consumer(subNc, "q.orders.n", { ackMode: "none" });
  await subNc.flush();
  await waitClaims(nc, "orders", 1);

  const N = 1000;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("none", i, `orders.n${i % 3}`));
  const res = await publishAll(nc, msgs, { concurrency: 128 });
  assert.equal(res.acked.size, N);
  await c.waitUnique(N, 60_000);
  await waitBacklog(nc, "orders", 0, 15_000);
  // delivered counter reaches N (it counts NATS-accepted publishes) and goes no further
  await waitFor(async () => metricValue(await bridge.metrics(), "fluxon_delivered_total", { channel: "orders" }) >= N,
    { timeout: 10_000, what: "fluxon_delivered_total >= N" });
  const ms = await bridge.metrics();
  assertNoConsumerErrors([c]);
  assertSameSet(msgs.map((m) => m.id), [...c.counts.keys()], "ack none");
  assertNoDuplicates([c]);
  assert.equal(c.records.length, N);
  assert.ok(c.records.every((r) => r.delivered === 1), "Fluxon-Delivered 1 everywhere");
  assert.equal(metricValue(ms, "fluxon_delivered_total", { channel: "orders" }), N, "fluxon_delivered_total");
  assert.equal(metricValue(ms, "fluxon_redelivered_total", { channel: "orders" }) || 0, 0, "no redelivery");
  // Still subscribed, and nothing comes back: an explicit channel would redeliver after ack_wait
  // (1 s, + backoff 200 ms); watch for 3 x ack_wait (x slow factor) that no delivery arrives and
  // the bridge redelivers nothing. (Waiting out a duration is the property here, not a sync.)
  const QUIET_MS = 3 * ACK_WAIT_MS * SLOW;
  const tQuiet = Date.now();
  while (Date.now() - tQuiet < QUIET_MS) {
    assert.equal(c.records.length, N, `a delivery ${Date.now() - tQuiet} ms after the backlog drained (ack none: no redelivery): ` +
      c.records.slice(N, N + 3).map((r) => `${r.id} Fluxon-Delivered ${r.delivered}`).join(", "));
    await new Promise((r) => setTimeout(r, 100)); // sampling period
  }
  await subNc.flush();
  assert.equal(c.records.length, N, `no delivery within ${QUIET_MS} ms after the backlog drained`);
  const ms2 = await bridge.metrics();
  assert.equal(metricValue(ms2, "fluxon_redelivered_total", { channel: "orders" }) || 0, 0, "no redelivery after 3 x ack_wait");
  assert.equal(metricValue(ms2, "fluxon_delivered_total", { channel: "orders" }), N, "fluxon_delivered_total still N after 3 x ack_wait");
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
});
