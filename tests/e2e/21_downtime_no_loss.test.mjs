// e2e_downtime_no_loss: an acked backlog, the bridge is stopped with SIGTERM, NO bridge
// runs for 3 x ttl_seconds (planned downtime: every member lease has expired), the bridge is
// started again and a subscriber receives every acked message; the MPMC is the same one.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, mpmcId } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert, assertCovers, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_downtime_no_loss", async (ctx) => {
  const TTL = 2;
  const st = await startStack(ctx);
  const bridge = st.bridge({ name: "down", defaults: { ttl_seconds: TTL, ack_wait: "5s" } });
  await bridge.start();
  const nc = await natsConnect(ctx, st.nats.url, "pub");

  const N = 1000;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("down", i, `orders.d${i % 3}`));
  const res = await publishAll(nc, msgs, { concurrency: 128, timeout: 10_000 });
  assert.equal(res.failed.size, 0, `publishes not acked: ${res.failed.size}; first: ${JSON.stringify([...res.failed.values()][0])}`);
  const ackedIds = [...res.acked.keys()];
  const idBefore = await mpmcId(st.etcd, st.prefix, "orders");

  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `SIGTERM exit ${JSON.stringify(ex)}`);
  // The point of the test: downtime with no bridge at all, longer than ttl_seconds (3 x).
  const downMs = 3 * TTL * 1000;
  const t0 = Date.now();
  await new Promise((r) => setTimeout(r, downMs));
  ctx.log(`${ackedIds.length} acked; no bridge for ${Date.now() - t0} ms (3 x ttl_seconds = ${downMs} ms)`);

  await bridge.start();
  const subNc = await natsConnect(ctx, st.nats.url, "sub");
  const c = new Consumer(subNc, "q.orders.down");
  await subNc.flush();
  const have = (id) => c.counts.has(id);
  try {
    await waitFor(async () => {
      c.check();
      if (ackedIds.every(have)) return true;
      const now = await mpmcId(st.etcd, st.prefix, "orders");
      if (now !== null && now !== idBefore) {
        const e = new Error(`the channel's MPMC was replaced (${idBefore} -> ${now}): its acked messages are gone`);
        e.fatal = true;
        throw e;
      }
      return false;
    }, { timeout: 30_000, interval: 200, what: () => `every acked message delivered after the downtime (have ${ackedIds.filter(have).length}/${ackedIds.length})` });
  } finally {
    const idAfter = await mpmcId(st.etcd, st.prefix, "orders").catch(() => "?");
    ctx.log(`downtime report: acked ${ackedIds.length}, delivered ${ackedIds.filter(have).length} distinct (${c.records.length} deliveries); mpmc ${idBefore} -> ${idAfter}`);
  }
  await waitBacklog(nc, "orders", 0, 20_000);
  assertNoConsumerErrors([c]);
  assertCovers(ackedIds, [...c.counts.keys()], "acked before the downtime");
  assert.equal(await mpmcId(st.etcd, st.prefix, "orders"), idBefore, "the channel's MPMC was not replaced");
  const ex2 = await bridge.stop();
  assert.equal(ex2.code, 0, `bridge exit ${JSON.stringify(ex2)}`);
  bridge.assertLogClean();
}, { timeout: 90_000 });
