// e2e_forged_no_responders_ignored: an outsider who sees every delivery (a credential-less
// "q.>" subscriber) forges 400 no-responders statuses (503) per claim over 5 s: to the exact
// reply subjects it observed (leaf path: the bridge never asks for a status there), with the nonce
// zeroed or altered, to the nonce-less "_FLUXON.NR.<bridge>.<channel>.<claim>.<claim seq>" form
// for every claim seq in use, and with random nonces. Nothing happens: no claim is released (the
// ready keys in etcd are unchanged), nothing is redelivered, the Fluxon-Delivered counts are
// unchanged (a NAK after the attack brings every message back with attempt 2),
// fluxon_invalid_control_total counts the forgeries and the warning about them is rate-limited.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, readyKeys, metricValue, ORDERS } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitClaims, waitBacklog, natsHeaders, Empty } from "./lib/client.mjs";
import { assert, assertSameSet, assertNoDuplicates, assertNoConsumerErrors } from "./lib/check.mjs";

const NEWS = { name: "news", subjects: ["news.>"], deliver_prefix: "q.news", ack: "none" };

test("e2e_forged_no_responders_ignored", async (ctx) => {
  const st = await startStack(ctx);
  // orders: explicit acks over the leaf connection; news: ack none over the client connection
  // (no-responders statuses are how it notices a subscriber that left).
  const bridge = await st.bridge({ name: "nr", channels: [ORDERS, NEWS] }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const subNc = await natsConnect(ctx, st.nats.url, "alice");
  const evil = await natsConnect(ctx, st.nats.url, "evil");

  let hold = true; // alice does not answer the first attempts until the attack is over
  const orders = new Consumer(subNc, "q.orders.alice", { ackMode: (m, rec) => (hold || rec.delivered === 1 ? null : "+ACK") });
  const news = new Consumer(subNc, "q.news.alice", { ackMode: "none" });
  const seen = []; // reply subjects the outsider observed
  evil.subscribe("q.>", { callback: (err, m) => { if (!err && m.reply) seen.push(m.reply); } });
  await Promise.all([subNc.flush(), evil.flush()]);
  await waitClaims(nc, "orders", 1);
  await waitClaims(nc, "news", 1);

  const N = 64;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("fnr", i, `orders.fnr${i % 4}`));
  assert.equal((await publishAll(nc, msgs, { concurrency: 32 })).acked.size, N);
  await orders.waitUnique(N, 20_000);
  const readyBefore = {
    orders: await readyKeys(st.etcd, st.prefix, "orders"),
    news: await readyKeys(st.etcd, st.prefix, "news"),
  };
  assert.equal(readyBefore.orders.length, 1, "orders claimed once");
  assert.equal(readyBefore.news.length, 1, "news claimed once");
  const before = await bridge.metrics();
  const invalidBefore = metricValue(before, "fluxon_invalid_control_total");
  assert.equal(invalidBefore, 0, "fluxon_invalid_control_total exported and 0 before the attack");
  await waitFor(() => seen.filter((r) => r.startsWith("$JS.ACK.")).length >= N, { timeout: 5000, what: "the outsider saw the orders replies" });
  const ordersReplies = seen.filter((r) => r.startsWith("$JS.ACK."));

  // 50 rounds over 5 s, 8 forgeries per claim per round = 400 per claim; news keeps flowing.
  const status = () => ({ headers: natsHeaders(503, "No Responders") });
  const rnd = () => String(1 + Math.floor(Math.random() * 2 ** 52));
  const newsMsgs = [];
  let sent = 0;
  const ROUNDS = 50;
  const t0 = Date.now();
  for (let r = 0; r < ROUNDS; r++) {
    for (let k = 0; k < 8; k++) {
      const real = ordersReplies[(r * 8 + k) % ordersReplies.length];
      const t = real.split(".");
      const variants = [
        real, // the exact reply, real nonce: a status the leaf path never asks for
        [...t.slice(0, 11), "0"].join("."),
        [...t.slice(0, 11), rnd()].join("."),
        ["$FLUXON", "ACK", ...t.slice(2)].join("."),
      ];
      evil.publish(variants[k % 4], Empty, status());
      const cseq = 1 + ((r * 8 + k) % 200);
      const newsSeen = seen.filter((s) => s.startsWith("_FLUXON.NR."));
      const nrVariants = [
        `_FLUXON.NR.nr.news.alice.${cseq}`, // the old nonce-less form
        `_FLUXON.NR.nr.news.alice.${cseq}.0`,
        `_FLUXON.NR.nr.news.alice.${cseq}.${rnd()}`,
        newsSeen.length ? newsSeen[newsSeen.length - 1] : `_FLUXON.NR.nr.news.alice.${cseq}.${rnd()}`,
      ];
      evil.publish(nrVariants[k % 4], Empty, status());
      sent += 2;
    }
    const m = makeMsg("fnrnews", r, "news.x");
    newsMsgs.push(m);
    nc.publish(m.subject, m.data, { headers: m.headers });
    await evil.flush();
    // pacing of the attack to spread it over 5 s (not a synchronisation wait)
    const next = t0 + ((r + 1) * 5000) / ROUNDS;
    if (next > Date.now()) await new Promise((res) => setTimeout(res, next - Date.now()));
  }
  ctx.log(`sent ${sent} forged statuses in ${Date.now() - t0} ms`);
  await waitFor(async () => metricValue(await bridge.metrics(), "fluxon_invalid_control_total") >= sent,
    { timeout: 10_000, what: `fluxon_invalid_control_total >= ${sent}` });
  await news.waitUnique(ROUNDS, 10_000);

  // No release: the same ready keys (same sub-MPSCs, same claiming members) as before.
  const same = (a, b) => JSON.stringify(a.map((k) => [k.key, k.value])) === JSON.stringify(b.map((k) => [k.key, k.value]));
  const readyAfter = { orders: await readyKeys(st.etcd, st.prefix, "orders"), news: await readyKeys(st.etcd, st.prefix, "news") };
  assert.ok(same(readyBefore.orders, readyAfter.orders), `orders claim changed: ${JSON.stringify(readyBefore.orders)} -> ${JSON.stringify(readyAfter.orders)}`);
  assert.ok(same(readyBefore.news, readyAfter.news), `news claim changed: ${JSON.stringify(readyBefore.news)} -> ${JSON.stringify(readyAfter.news)}`);
  // No redelivery.
  const ms = await bridge.metrics();
  assert.equal(orders.records.length, N, "orders: no redelivery during the attack");
  assert.equal(metricValue(ms, "fluxon_redelivered_total", { channel: "orders" }) || 0, 0, "fluxon_redelivered_total orders");
  assert.ok(orders.records.every((r) => r.delivered === 1), "first attempts");
  assertSameSet(newsMsgs.map((m) => m.id), [...news.counts.keys()], "news during the attack");
  assertNoDuplicates([news], "news deliveries");
  assert.ok(news.records.every((r) => r.delivered === 1), "news: Fluxon-Delivered 1");

  // Delivery counts unchanged: NAK every first attempt; each comes back as attempt 2, then acked.
  hold = false;
  for (const rec of orders.records.slice()) rec.msg.respond(new TextEncoder().encode("-NAK"));
  await subNc.flush();
  await waitFor(() => orders.records.length >= 2 * N, { timeout: 15_000, what: () => `${N} redeliveries (have ${orders.records.length - N})` });
  await waitBacklog(nc, "orders", 0, 15_000);
  const second = orders.records.slice(N);
  assert.ok(second.every((r) => r.delivered === 2), `redeliveries carry Fluxon-Delivered 2: ${second.map((r) => r.delivered).join(",")}`);
  assertSameSet(msgs.map((m) => m.id), second.map((r) => r.id), "redelivered once each");
  assertNoConsumerErrors([orders, news]);

  // Rate-logged: a handful of warnings, not one per forgery.
  const warns = bridge.log().split("\n").filter((l) => l.includes("did not cause"));
  ctx.log(`${warns.length} warning line(s) for ${sent} forgeries`);
  assert.ok(warns.length >= 1 && warns.length <= 6, `rate-limited warnings: ${warns.length}`);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
});
