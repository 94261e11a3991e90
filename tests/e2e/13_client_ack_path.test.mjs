// e2e_client_ack_path: a bridge without nats.leaf_url delivers over its client connection, where
// nats-server forbids "$JS.ACK." replies; deliveries then carry the same 12-token layout under
// "$FLUXON.ACK.", acks and NAKs on it drive the bridge, and the backlog drains.
import { test } from "./lib/runner.mjs";
import { startStack, metricValue, waitFor } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitClaims, waitBacklog } from "./lib/client.mjs";
import { assert, assertSameSet, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_client_ack_path", async (ctx) => {
  const st = await startStack(ctx);
  const bridge = await st.bridge({ name: "cap", leaf: false }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const subNc = await natsConnect(ctx, st.nats.url, "sub");
  // NAK the first delivery of every 5th message; ack everything else.
  const c = new Consumer(subNc, "q.orders.cl", {
    ackMode: (m, rec) => (rec.n % 5 === 0 && rec.delivered === 1 ? "-NAK" : "+ACK"),
  });
  await subNc.flush();
  await waitClaims(nc, "orders", 1);

  const N = 200;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("cap", i, "orders.cl"));
  const res = await publishAll(nc, msgs, { concurrency: 64 });
  assert.equal(res.acked.size, N);
  await c.waitUnique(N, 30_000);
  await waitBacklog(nc, "orders", 0, 15_000);
  await waitFor(async () => metricValue(await bridge.metrics(), "fluxon_acked_total", { channel: "orders" }) >= N,
    { timeout: 10_000, what: "fluxon_acked_total >= N" });

  assertNoConsumerErrors([c]);
  assertSameSet(msgs.map((m) => m.id), [...c.counts.keys()], "client ack path");
  const prefixes = new Set(c.records.map((r) => r.reply.split(".").slice(0, 2).join(".")));
  assert.deepEqual([...prefixes], ["$FLUXON.ACK"], "reply prefix without a leaf connection");
  assert.ok(c.records.every((r) => r.reply.split(".").length === 12), "12-token replies");
  const naked = c.records.filter((r) => r.n % 5 === 0);
  assert.ok(naked.some((r) => r.delivered === 2), "NAKed messages come back with Fluxon-Delivered 2");
  assert.equal(c.records.length, N + N / 5, "each NAKed message delivered exactly twice, the rest once");
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
});
