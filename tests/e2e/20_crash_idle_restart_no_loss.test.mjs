// e2e_crash_idle_restart_no_loss (issue 9): 3,000 acked publishes with nobody subscribed, the
// bridge is killed with SIGKILL and started again at once, then nothing happens for
// 3 x ttl_seconds (no publish, no subscriber: only the restarted bridge itself can keep the
// channel alive); a subscriber that comes afterwards receives every acked message.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, mpmcId } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert, assertCovers, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_crash_idle_restart_no_loss", async (ctx) => {
  const TTL = 2;
  const st = await startStack(ctx);
  const bridge = st.bridge({ name: "idle", defaults: { ttl_seconds: TTL, ack_wait: "5s" } });
  await bridge.start();
  const nc = await natsConnect(ctx, st.nats.url, "pub");

  const N = 3000;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("idle", i, `orders.i${i % 4}`));
  const res = await publishAll(nc, msgs, { concurrency: 256, timeout: 10_000 });
  assert.equal(res.failed.size, 0, `publishes not acked: ${res.failed.size}; first: ${JSON.stringify([...res.failed.values()][0])}`);
  const ackedIds = [...res.acked.keys()];
  const idBefore = await mpmcId(st.etcd, st.prefix, "orders");
  ctx.log(`${ackedIds.length} acked, nobody subscribed; mpmc ${idBefore}`);

  const ex = await bridge.kill9();
  ctx.log(`SIGKILL: ${JSON.stringify(ex)}`);
  await bridge.start();
  // The point of the test: wall-clock time passes with the restarted bridge alone and no traffic,
  // longer than every member lease of the killed process (3 x ttl_seconds).
  const idleMs = 3 * TTL * 1000;
  const t0 = Date.now();
  await new Promise((r) => setTimeout(r, idleMs));
  ctx.log(`idle for ${Date.now() - t0} ms (3 x ttl_seconds = ${idleMs} ms) with the restarted bridge`);

  const subNc = await natsConnect(ctx, st.nats.url, "sub");
  const c = new Consumer(subNc, "q.orders.idle");
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
    }, { timeout: 30_000, interval: 200, what: () => `every acked message delivered after the idle restart (have ${ackedIds.filter(have).length}/${ackedIds.length})` });
  } finally {
    const idAfter = await mpmcId(st.etcd, st.prefix, "orders").catch(() => "?");
    const replaced = (bridge.log().match(/is gone \(meta or leases expired\)[^\n]*/g) || []);
    ctx.log(`crash-idle report: acked ${ackedIds.length}, delivered ${ackedIds.filter(have).length} distinct (${c.records.length} deliveries, ${c.duplicates().length} duplicated ids); mpmc ${idBefore} -> ${idAfter}; replacements logged: ${replaced.length}${replaced.length ? ` ("${replaced[0]}")` : ""}`);
  }
  await waitBacklog(nc, "orders", 0, 20_000);
  assertNoConsumerErrors([c]);
  assertCovers(ackedIds, [...c.counts.keys()], "acked before the crash");
  assert.equal(await mpmcId(st.etcd, st.prefix, "orders"), idBefore, "the channel's MPMC was not replaced");
  const ex2 = await bridge.stop();
  assert.equal(ex2.code, 0, `bridge exit ${JSON.stringify(ex2)}`);
}, { timeout: 90_000 });
