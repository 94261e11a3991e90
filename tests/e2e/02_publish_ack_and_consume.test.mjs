// e2e_publish_ack_and_consume: 10,000 messages published with acks to two capture subjects;
// consumers q.orders.a (acks "+ACK") and q.orders.b (two queue-group members sharing one claim, acking
// with an empty body and "+ACK") receive exactly the published set between them, both get a share,
// headers and data intact, Fluxon-* headers right; a wildcard q.orders.> observer sees every
// delivery once and takes no claim.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitUniqueAcross, waitClaims, waitBacklog, channelInfo, readyCount } from "./lib/client.mjs";
import { assert, assertSameSet, assertNoDuplicates, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_publish_ack_and_consume", async (ctx) => {
  const st = await startStack(ctx);
  const bridge = await st.bridge({ name: "pac" }).start();
  const pubNc = await natsConnect(ctx, st.nats.url, "pub");
  const ncA = await natsConnect(ctx, st.nats.url, "a");
  const ncB = await natsConnect(ctx, st.nats.url, "b");
  const ncB2 = await natsConnect(ctx, st.nats.url, "b2");
  const ncW = await natsConnect(ctx, st.nats.url, "watch");
  const a = new Consumer(ncA, "q.orders.a", { ackMode: "ack" });
  // name b: two processes in one queue group share one claim
  const b = new Consumer(ncB, "q.orders.b", { ackMode: "empty", queue: "workers" });
  const b2 = new Consumer(ncB2, "q.orders.b", { ackMode: "ack", queue: "workers" });
  // a wildcard subscriber observes every delivery and creates no claim (it never acks)
  const watch = new Consumer(ncW, "q.orders.>", { ackMode: "none" });
  await Promise.all([ncA.flush(), ncB.flush(), ncB2.flush(), ncW.flush()]);
  // Both claims held before the stream starts, so the producer rotates over both sub-MPSCs.
  await waitClaims(pubNc, "orders", 2, 15_000);

  const N = 10_000;
  const subjects = ["orders.eu.new", "orders.us.new"];
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("pac", i, subjects[i % 2]));
  const t0 = Date.now();
  const res = await publishAll(pubNc, msgs, { concurrency: 256, timeout: 30_000 });
  const pubMs = Date.now() - t0;
  assert.equal(res.failed.size, 0, `failed publishes: ${[...res.failed].slice(0, 5).map(([id, r]) => `${id}: ${r.error}`).join("; ")}`);
  assert.equal(res.acked.size, N);
  const seqs = new Set();
  for (const [id, ack] of res.acked) {
    assert.equal(ack.stream, "orders", `PubAck stream of ${id}`);
    assert.ok(Number.isInteger(ack.seq) && ack.seq > 0, `PubAck seq of ${id}: ${JSON.stringify(ack)}`);
    seqs.add(ack.seq);
  }
  assert.equal(seqs.size, N, "PubAck seqs distinct");
  ctx.log(`published ${N} acked in ${pubMs} ms`);

  await waitUniqueAcross([a, b, b2], N, 120_000);
  ctx.log(`received a=${a.unique} b=${b.unique}+${b2.unique} (queue group) in ${Date.now() - t0} ms; wildcard observer ${watch.records.length}`);
  await waitBacklog(pubNc, "orders", 0, 30_000);

  assertNoConsumerErrors([a, b, b2, watch]);
  assertSameSet(msgs.map((m) => m.id), [...a.counts.keys(), ...b.counts.keys(), ...b2.counts.keys()], "a+b");
  assertNoDuplicates([a, b, b2]);
  assert.equal(a.records.length + b.records.length + b2.records.length, N, "deliveries = published");
  assert.ok(a.unique > 0 && b.unique + b2.unique > 0, `both claims got a share (a=${a.unique}, b=${b.unique + b2.unique})`);
  await waitFor(() => watch.records.length >= N, { timeout: 10_000, what: "the wildcard observer saw every delivery" });
  assert.equal(watch.records.length, N, "wildcard observer: one copy of each delivery");
  assertSameSet(msgs.map((m) => m.id), [...watch.counts.keys()], "wildcard observer");
  const info = await channelInfo(pubNc, "orders");
  assert.equal(readyCount(info), 2, `claims: a and b only (queue group shares, wildcard none): ${JSON.stringify(info.sub_mpscs)}`);

  const byId = new Map(msgs.map((m) => [m.id, m]));
  for (const [c, name] of [[a, "a"], [b, "b"], [b2, "b"]]) {
    for (const r of c.records) {
      const m = byId.get(r.id);
      assert.equal(r.subject, `q.orders.${name}`);
      assert.equal(r.xid, r.id, `X-Id header of ${r.id}`);
      assert.deepEqual(r.multi, [`first-${m.n}`, "second"], `multi-value header of ${r.id}`);
      assert.equal(r.fluxonSubject, m.subject, `Fluxon-Subject of ${r.id}`);
      assert.equal(r.origSubject, m.subject);
      assert.equal(r.channel, "orders", `Fluxon-Channel of ${r.id}`);
      assert.equal(r.delivered, 1, `Fluxon-Delivered of ${r.id}`);
      assert.equal(Number(r.seq), res.acked.get(r.id).seq, `Fluxon-Seq of ${r.id} = PubAck seq`);
      // the reply (ack) subject names this bridge, the channel and the claim (its exact JetStream
      // layout is checked by e2e_jetstream_client_compat)
      assert.ok(r.reply.includes(`.pac.orders.${name}.`), `ack reply of ${r.id}: ${r.reply}`);
    }
  }
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
}, { timeout: 240_000 });
