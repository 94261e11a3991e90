// e2e_msg_id_dedup: Nats-Msg-Id dedup with the channel's duplicate_window, as JetStream does it.
// The same id published twice is stored once and the second PubAck says duplicate:true with the
// first seq; the window lives in etcd (keys bound to an expiring lease), so it holds across a
// bridge restart and across two bridges (the queue group spreads the publishes over both);
// after the window the id is stored again. Publishes without the header are never deduplicated.
// Nats-Expected-Stream naming another stream gets JetStream's error (err_code 10060); other
// Nats-Expected-* headers get a clear "not supported" error instead of being ignored.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, metricValue, ORDERS } from "./lib/stack.mjs";
import { natsConnect, Consumer, waitBacklog } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

const body = (s) => new TextEncoder().encode(s);

test("e2e_msg_id_dedup", async (ctx) => {
  const st = await startStack(ctx);
  const orders = { ...ORDERS, duplicate_window: "1m" };
  const short = { name: "short", subjects: ["short.>"], deliver_prefix: "q.short", duplicate_window: "2s" };
  const channels = [orders, short];
  const a = await st.bridge({ name: "a", channels }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const js = nc.jetstream();

  // Twice through one bridge.
  const p1 = await js.publish("orders.x", body("one"), { msgID: "id-1" });
  assert.ok(!p1.duplicate, "first publish of id-1 is stored");
  const p2 = await js.publish("orders.x", body("one again"), { msgID: "id-1" });
  ctx.log(`id-1: first ${JSON.stringify(p1)}, second ${JSON.stringify(p2)}`);
  assert.equal(p2.duplicate, true, "second publish of id-1: duplicate");
  assert.equal(p2.seq, p1.seq, "duplicate PubAck carries the first seq");
  // Without the header nothing is deduplicated.
  const n1 = await js.publish("orders.x", body("plain"));
  const n2 = await js.publish("orders.x", body("plain"));
  assert.ok(!n1.duplicate && !n2.duplicate && n1.seq !== n2.seq, "publishes without Nats-Msg-Id both stored");

  // The window is in etcd, bound to a lease.
  const keys = await st.etcd.range(`${st.prefix}/dedup/orders/`);
  ctx.log(`dedup keys: ${keys.map((k) => `${k.key}=${k.value} lease ${k.lease}`).join(", ")}`);
  assert.deepEqual(keys.map((k) => k.key), [`${st.prefix}/dedup/orders/id-1`]);
  assert.notEqual(keys[0].lease, "0", "dedup key bound to a lease");

  // Across a bridge restart.
  const ea = await a.stop();
  assert.equal(ea.code, 0);
  await a.start();
  const p3 = await js.publish("orders.x", body("after restart"), { msgID: "id-1" });
  assert.equal(p3.duplicate, true, "id-1 after the bridge restart: duplicate");
  assert.equal(p3.seq, p1.seq);

  // Across two bridges: the queue group spreads 20 publishes of one id over a and b.
  const b = await st.bridge({ name: "b", channels }).start();
  const capOf = async (br) => metricValue(await br.metrics(), "fluxon_captured_total", { channel: "orders" }) || 0;
  const ca0 = await capOf(a);
  const cb0 = await capOf(b);
  const acks = [];
  for (let i = 0; i < 20; i++) acks.push(await js.publish("orders.y", body(`two ${i}`), { msgID: "id-2" }));
  const ca = (await capOf(a)) - ca0;
  const cb = (await capOf(b)) - cb0;
  ctx.log(`id-2 x20: captured by a ${ca}, by b ${cb}; stored ${acks.filter((x) => !x.duplicate).length}`);
  assert.ok(ca > 0 && cb > 0, "both bridges captured some of the publishes");
  assert.equal(acks.filter((x) => !x.duplicate).length, 1, "id-2 stored once across two bridges");
  assert.ok(!acks[0].duplicate, "the first one is the stored one");
  assert.ok(acks.every((x) => x.seq === acks[0].seq), "every duplicate PubAck names the stored seq");
  // And through the other bridge alone.
  await a.stop();
  const p4 = await js.publish("orders.x", body("via b"), { msgID: "id-1" });
  assert.equal(p4.duplicate, true, "id-1 through bridge b: duplicate");
  assert.equal(p4.seq, p1.seq);
  const dups = metricValue(await b.metrics(), "fluxon_duplicates_total", { channel: "orders" });
  assert.ok(dups >= 1, `fluxon_duplicates_total on b: ${dups}`);

  // Exactly four messages stored: id-1, two plain ones, id-2; each delivered once.
  await waitBacklog(nc, "orders", 4);
  const c = new Consumer(nc, "q.orders.c");
  await waitFor(() => c.records.length >= 4, { timeout: 15_000, what: "4 deliveries" });
  await waitBacklog(nc, "orders", 0);
  const seqs = c.records.map((r) => Number(r.seq)).sort();
  assert.deepEqual(seqs, [p1.seq, n1.seq, n2.seq, acks[0].seq].sort(), "the stored messages, once each");

  // After the window (2s on channel short) the id is stored again.
  const w1 = await js.publish("short.w", body("w"), { msgID: "id-w" });
  const t0 = Date.now();
  assert.ok(!w1.duplicate);
  const w2 = await js.publish("short.w", body("w"), { msgID: "id-w" });
  assert.equal(w2.duplicate, true, "inside the window: duplicate");
  const again = await waitFor(async () => {
    const r = await js.publish("short.w", body("w"), { msgID: "id-w" });
    return r.duplicate ? null : r;
  }, { timeout: 15_000, interval: 200, what: "id-w stored again after the window" });
  const took = Date.now() - t0;
  ctx.log(`id-w stored again after ${took} ms (window 2s), seq ${again.seq} (first ${w1.seq})`);
  assert.ok(took >= 1900, `not before the window: ${took} ms`);
  assert.notEqual(again.seq, w1.seq, "a new message");

  // Nats-Expected-Stream.
  const ok = await js.publish("orders.z", body("expect"), { expect: { streamName: "orders" } });
  assert.ok(ok.seq > 0, "the right expected stream is accepted");
  await assert.rejects(js.publish("orders.z", body("expect"), { expect: { streamName: "other" } }), (e) => {
    ctx.log(`expected stream mismatch: ${JSON.stringify(e.api_error)}`);
    return e.api_error && e.api_error.code === 400 && e.api_error.err_code === 10060;
  });
  await assert.rejects(js.publish("orders.z", body("expect"), { expect: { lastSequence: 3 } }), (e) => {
    ctx.log(`Nats-Expected-Last-Sequence: ${JSON.stringify(e.api_error)}`);
    return e.api_error && e.api_error.code === 400 && /Nats-Expected-Last-Sequence.*not supported/.test(e.api_error.description);
  });
  // Only the accepted "expect" publish was stored.
  await waitFor(() => c.records.length >= 5, { timeout: 15_000, what: "the accepted publish delivered" });
  await waitBacklog(nc, "orders", 0);
  assert.deepEqual(c.records.slice(4).map((r) => Number(r.seq)), [ok.seq], "rejected publishes were not stored");

  const eb = await b.stop();
  assert.equal(eb.code, 0, `bridge b exit ${JSON.stringify(eb)}`);
  a.assertLogClean();
  b.assertLogClean();
}, { timeout: 120_000 });
