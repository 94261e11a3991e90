// e2e_nak_backoff_durable: a durable consumer's own NAK policy, on pull requests. The channels
// have none (backoff [], nak_delay 0s: a plain NAK comes back at once); the durable "bo" has
// backoff [1s, 3s]: its plain NAKs redeliver after ~1 s, then ~3 s, never earlier; the durable
// "ndw" has nak_delay 2s (a bridge setting in the consumer config): its plain NAK redelivers after
// ~2 s. Lower bounds are strict (a redelivery before its delay fails), upper bounds stretch with
// SLOW. Consumer info shows the stored settings.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, SLOW } from "./lib/stack.mjs";
import { natsConnect, makeMsg, publishAll } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

// Both clocks truncate to whole ms: an arrival can look up to 2 ms early (as e2e_nak_backoff).
const TRUNC_MS = 2;
const LATE_MS = 1500 * SLOW;
const S = 1e9;

/** One long pull request on consumer `name` of `chan`; each delivery is recorded (id, delivered
 * count from the $JS.ACK reply, arrival) and answered with ackMode(rec). */
function puller(ctx, nc, chan, name, ackMode) {
  const inbox = `_INBOX.nakbo.${name}`;
  const recs = [];
  const sub = nc.subscribe(inbox);
  (async () => {
    for await (const m of sub) {
      if (!m.reply || !m.reply.startsWith("$JS.ACK.")) { ctx.log(`${name}: status ${m.headers?.code} ${m.headers?.description}`); continue; }
      const rec = { id: m.headers?.get("X-Id"), delivered: Number(m.reply.split(".")[6]), at: Date.now() };
      recs.push(rec);
      m.respond(new TextEncoder().encode(ackMode(rec)));
    }
  })();
  ctx.defer(() => sub.unsubscribe());
  nc.publish(`$JS.API.CONSUMER.MSG.NEXT.${chan}.${name}`, JSON.stringify({ batch: 100, expires: 120 * S }), { reply: inbox });
  return recs;
}

test("e2e_nak_backoff_durable", async (ctx) => {
  const st = await startStack(ctx);
  const channels = [
    { name: "orders", subjects: ["orders.>"], deliver_prefix: "q.orders", backoff: [], nak_delay: "0s" },
    { name: "nd", subjects: ["nd.>"], deliver_prefix: "q.nd", backoff: [], nak_delay: "0s" },
  ];
  await st.bridge({ name: "nakdur", defaults: { max_deliver: 5, ack_wait: "60s" }, channels }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const jsapi = async (subj, body) => JSON.parse(new TextDecoder().decode(
    (await nc.request(`$JS.API.${subj}`, JSON.stringify(body), { timeout: 5000 })).data));
  let r = await jsapi("CONSUMER.CREATE.orders.bo", { stream_name: "orders",
    config: { durable_name: "bo", ack_policy: "explicit", max_deliver: 5, backoff: [1 * S, 3 * S] } });
  assert.ok(!r.error, JSON.stringify(r.error));
  assert.deepEqual(r.config.backoff, [1 * S, 3 * S]);
  r = await jsapi("CONSUMER.CREATE.nd.ndw", { stream_name: "nd",
    config: { durable_name: "ndw", ack_policy: "explicit", max_deliver: 5, nak_delay: 2 * S } });
  assert.ok(!r.error, JSON.stringify(r.error));
  assert.equal(r.config.nak_delay, 2 * S, `nak_delay stored: ${JSON.stringify(r.config)}`);
  r = await jsapi("CONSUMER.INFO.nd.ndw", {});
  assert.equal(r.config.nak_delay, 2 * S, "consumer info shows nak_delay");

  const bo = puller(ctx, nc, "orders", "bo", (rec) => (rec.delivered < 3 ? "-NAK" : "+ACK"));
  const nd = puller(ctx, nc, "nd", "ndw", (rec) => (rec.delivered < 2 ? "-NAK" : "+ACK"));
  await nc.flush();
  const boMsgs = [0, 1, 2].map((i) => makeMsg("bo", i, "orders.x"));
  const ndMsgs = [0, 1].map((i) => makeMsg("nd", i, "nd.x"));
  for (const set of [boMsgs, ndMsgs]) assert.equal((await publishAll(nc, set, { concurrency: 16 })).acked.size, set.length);

  const count = (recs, id) => recs.filter((x) => x.id === id).length;
  for (const m of boMsgs) await waitFor(() => count(bo, m.id) >= 3, { timeout: 20_000, what: `3 deliveries of ${m.id} to bo` });
  for (const m of ndMsgs) await waitFor(() => count(nd, m.id) >= 2, { timeout: 20_000, what: `2 deliveries of ${m.id} to ndw` });
  for (const m of boMsgs) {
    const rs = bo.filter((x) => x.id === m.id);
    assert.deepEqual(rs.map((x) => x.delivered), [1, 2, 3], `delivery counts of ${m.id}`);
    const d1 = rs[1].at - rs[0].at, d2 = rs[2].at - rs[1].at;
    ctx.log(`bo ${m.id}: redelivered after ${d1} ms then ${d2} ms`);
    assert.ok(d1 >= 1000 - TRUNC_MS, `first NAK of ${m.id} redelivered after ${d1} ms < 1 s (the durable's backoff[0])`);
    assert.ok(d1 <= 1000 + LATE_MS, `first NAK of ${m.id} redelivered after ${d1} ms`);
    assert.ok(d2 >= 3000 - TRUNC_MS, `second NAK of ${m.id} redelivered after ${d2} ms < 3 s (the durable's backoff[1])`);
    assert.ok(d2 <= 3000 + LATE_MS, `second NAK of ${m.id} redelivered after ${d2} ms`);
  }
  for (const m of ndMsgs) {
    const rs = nd.filter((x) => x.id === m.id);
    assert.deepEqual(rs.map((x) => x.delivered), [1, 2], `delivery counts of ${m.id}`);
    const d = rs[1].at - rs[0].at;
    ctx.log(`ndw ${m.id}: redelivered after ${d} ms`);
    assert.ok(d >= 2000 - TRUNC_MS, `NAK of ${m.id} redelivered after ${d} ms < 2 s (the durable's nak_delay)`);
    assert.ok(d <= 2000 + LATE_MS, `NAK of ${m.id} redelivered after ${d} ms`);
  }
}, { timeout: 120_000 });
