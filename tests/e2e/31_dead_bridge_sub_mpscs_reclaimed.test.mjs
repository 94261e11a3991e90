// e2e_dead_bridge_sub_mpscs_reclaimed: sub-MPSCs follow the names in use even when the
// bridge that held them died. Bridge A claims 8 names (8 sub-MPSCs), every message published is
// delivered and acked (no backlog), then the names leave and A is killed with SIGKILL before it
// could release its claims (a consumer's own close reclaims its sub-MPSC; a killed bridge closes
// nothing). Bridge B runs with no names: once A's member leases expire, B's house-keeping sweep
// reclaims the idle sub-MPSCs (unready, no consumer, no backlog) down to the one a channel keeps
// for store-and-forward, and counts them in fluxon_sub_mpscs_reclaimed_total. A publish after
// that is stored and delivered to a new name: nothing of the channel was lost.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, metricValue, mpmcId, subMpscIds } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert, assertCovers, assertNoConsumerErrors } from "./lib/check.mjs";

const NAMES = 8;

test("e2e_dead_bridge_sub_mpscs_reclaimed", async (ctx) => {
  const st = await startStack(ctx);
  const defaults = { ttl_seconds: 3, release_after: "60s", interest_poll: "200ms" };
  const A = st.bridge({ name: "A", defaults });
  await A.start();
  const subNc = await natsConnect(ctx, st.nats.url, "subs");
  const consumers = Array.from({ length: NAMES }, (_, i) => new Consumer(subNc, `q.orders.n${i}`));
  await subNc.flush();
  const claims = async (b) => metricValue(await b.metrics(), "fluxon_claims", { channel: "orders" }) || 0;
  let c = 0;
  await waitFor(async () => (c = await claims(A)) >= NAMES, { timeout: 30_000, interval: 100, what: () => `${NAMES} claims on A (have ${c})` });

  const pubNc = await natsConnect(ctx, st.nats.url, "pub");
  const msgs = Array.from({ length: 200 }, (_, i) => makeMsg("R", i, `orders.k${i % 8}`));
  const res = await publishAll(pubNc, msgs, { concurrency: 64, timeout: 10_000 });
  assert.equal(res.failed.size, 0, `not acked: ${res.failed.size}`);
  const acked = [...res.acked.keys()];
  const have = () => new Set(consumers.flatMap((k) => [...k.counts.keys()]));
  await waitFor(() => have().size >= acked.length, { timeout: 30_000, interval: 100, what: () => `every acked message delivered (have ${have().size}/${acked.length})` });
  assertNoConsumerErrors(consumers);
  assertCovers(acked, [...have()], "acked messages before the kill");
  await waitBacklog(pubNc, "orders", 0, 30_000);

  const id = await mpmcId(st.etcd, st.prefix, "orders");
  const before = (await subMpscIds(st.etcd, st.prefix, id)).length;
  ctx.log(`sub-MPSCs with ${NAMES} names on A: ${before}`);
  assert.ok(before >= NAMES, `expected one sub-MPSC per name, have ${before}`);

  // The names leave and A dies before its release_after: nothing of A's closes.
  await subNc.close();
  const ex = await A.kill9();
  ctx.log(`A killed: ${JSON.stringify(ex)}`);

  const B = st.bridge({ name: "B", defaults });
  await B.start();
  let subs = before;
  try {
    await waitFor(async () => (subs = (await subMpscIds(st.etcd, st.prefix, id)).length) <= 1, { timeout: 40_000, interval: 250, what: () => `idle sub-MPSCs of the dead bridge reclaimed (have ${subs}, had ${before})` });
  } finally {
    ctx.log(`sub-MPSCs: ${before} -> ${subs}`);
  }
  const reclaimed = metricValue(await B.metrics(), "fluxon_sub_mpscs_reclaimed_total", { channel: "orders" }) || 0;
  ctx.log(`B reclaimed ${reclaimed}`);
  assert.ok(reclaimed >= before - 1, `fluxon_sub_mpscs_reclaimed_total ${reclaimed}, want >= ${before - 1}`);

  // The channel still works: a publish is stored and reaches a new name.
  const res2 = await publishAll(pubNc, [makeMsg("R2", 0, "orders.after")], { concurrency: 1, timeout: 10_000 });
  assert.equal(res2.failed.size, 0, "publish after the reclaim acked");
  const subNc2 = await natsConnect(ctx, st.nats.url, "subs2");
  const late = new Consumer(subNc2, "q.orders.late");
  await subNc2.flush();
  await waitFor(() => late.unique >= 1, { timeout: 30_000, interval: 100, what: () => `the late name received the message (have ${late.unique})` });
  assertNoConsumerErrors([late]);
  const exB = await B.stop();
  assert.equal(exB.code, 0, `bridge B exit ${JSON.stringify(exB)}`);
}, { timeout: 150_000 });
