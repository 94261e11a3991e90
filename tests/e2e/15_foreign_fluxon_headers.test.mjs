// e2e_foreign_fluxon_headers_captured: a consumer republishes every delivery it gets, with all
// its headers (Fluxon-Channel, Fluxon-Seq, Fluxon-Origin, ...), to a capture subject of another
// channel and of the same channel. The bridge skips only its own deliveries (proven by the keyed
// Fluxon-Origin tag, which holds for one delivery subject and reply); these republished copies are
// captured: each gets a PubAck, is delivered again with the new channel's Fluxon-* headers and its
// own headers intact, and is counted in fluxon_foreign_headers_total. Nothing is dropped silently.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, metricValue, ORDERS } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, publishAcked, waitClaims, waitBacklog } from "./lib/client.mjs";
import { assert, assertSameSet, assertNoConsumerErrors } from "./lib/check.mjs";

const AUDIT = { name: "audit", subjects: ["audit.>"], deliver_prefix: "q.audit" };

test("e2e_foreign_fluxon_headers_captured", async (ctx) => {
  const st = await startStack(ctx);
  const bridge = await st.bridge({ name: "fh", channels: [ORDERS, AUDIT] }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const subNc = await natsConnect(ctx, st.nats.url, "sub");
  const forwards = []; // promises of the republishes' PubAcks
  const orders = new Consumer(subNc, "q.orders.alice", {
    ackMode: (m, rec, c) => {
      if (rec.id && c.counts.get(rec.id) === 1) { // first copy only (the one republished into orders comes back)
        // forward the delivery as it is, headers included, to the other channel ...
        forwards.push(publishAcked(nc, { subject: "audit.copy", data: m.data, headers: m.headers }).then((r) => ({ to: "audit", id: rec.id, r })));
      }
      return "+ACK";
    },
  });
  const audit = new Consumer(subNc, "q.audit.bob");
  await subNc.flush();
  await waitClaims(nc, "orders", 1);
  await waitClaims(nc, "audit", 1);

  const N = 20;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("fh", i, "orders.fh"));
  assert.equal((await publishAll(nc, msgs, { concurrency: 8 })).acked.size, N);
  await orders.waitUnique(N, 15_000);
  // ... and a delivery republished into its own channel's capture subject
  const first = orders.records[0];
  const again = await publishAcked(nc, { subject: "orders.again", data: first.msg.data, headers: first.msg.headers });
  assert.ok(again.ok, `republish into orders: ${JSON.stringify(again)}`);
  assert.equal(again.ack.stream, "orders");

  await waitFor(() => forwards.length >= N, { timeout: 5000, what: "forwards issued" });
  const results = await Promise.all(forwards);
  const bad = results.filter((x) => !x.r.ok);
  assert.equal(bad.length, 0, `republished deliveries without a PubAck: ${JSON.stringify(bad.slice(0, 3))}`);
  assert.ok(results.every((x) => x.r.ack.stream === "audit"), "PubAcks name the audit channel");

  await audit.waitUnique(N, 15_000);
  assertSameSet(msgs.map((m) => m.id), [...audit.counts.keys()], "forwarded copies delivered on audit");
  for (const r of audit.records) {
    assert.equal(r.channel, "audit", "Fluxon-Channel rewritten to the new channel");
    assert.equal(r.fluxonSubject, "audit.copy", "Fluxon-Subject is the republish subject");
    assert.equal(r.xid, r.id, "the message's own headers kept");
    assert.equal(r.headers.values("Fluxon-Channel").length, 1, "one Fluxon-Channel");
  }
  // the copy republished into orders comes back to alice as a new message (second delivery of that id)
  await waitFor(() => orders.counts.get(first.id) >= 2, { timeout: 10_000, what: "the copy republished into orders delivered" });
  await waitBacklog(nc, "orders", 0);
  await waitBacklog(nc, "audit", 0);

  const ms = await bridge.metrics();
  assert.equal(metricValue(ms, "fluxon_foreign_headers_total", { channel: "audit" }), N, "counted on audit");
  assert.equal(metricValue(ms, "fluxon_foreign_headers_total", { channel: "orders" }), 1, "counted on orders");
  assert.equal(metricValue(ms, "fluxon_captured_total", { channel: "audit" }), N, "captured on audit");
  assert.equal(metricValue(ms, "fluxon_captured_total", { channel: "orders" }), N + 1, "captured on orders");
  assert.equal(metricValue(ms, "fluxon_own_deliveries_skipped_total", { channel: "orders" }), 0, "nothing skipped");
  assertNoConsumerErrors([orders, audit]);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
});
