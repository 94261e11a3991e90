// e2e_crash_idle_restart_no_loss: channel "orders" has `retention` 5 s
// (ttl_seconds 2): its data leases (metadata, payload, id-allocator; deploy/README.md
// "Durability") expire 5 s after their last renewal. 3,000 acked publishes with nobody subscribed,
// the bridge is killed with SIGKILL and started again at once, then nothing happens for
// 2 x retention (no publish, no subscriber). The killed process renews nothing, and the one-shot
// keepalives of the restart (resolve, attach probes) last one retention: only the restarted
// bridge's periodic renewal keeps the channel alive through that window. Checked from etcd while
// idle (each data lease is still alive 2 x retention after the restart: something renewed it,
// and nothing but the restarted bridge runs); then a subscriber that comes afterwards receives
// every acked message and the MPMC is the same one.
// (With the default retention of 7 days, a restarted bridge that renewed nothing would pass.)
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, mpmcId, mpmcMetaLeases, ORDERS, SLOW } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert, assertCovers, assertNoConsumerErrors } from "./lib/check.mjs";

const LEASE_FIELDS = ["metadata_lease_id", "payload_lease_id", "id_allocator_cluster_lease_id"];

test("e2e_crash_idle_restart_no_loss", async (ctx) => {
  const TTL = 2;
  // Stretched on slow builds: the bridge must restart well within one retention of the kill
  // (the killed process last renewed at most retention / 3 before it died).
  const RETENTION_S = 5 * SLOW;
  const st = await startStack(ctx);
  const bridge = st.bridge({
    name: "idle",
    defaults: { ttl_seconds: TTL, ack_wait: "5s" },
    channels: [{ ...ORDERS, retention: `${RETENTION_S}s` }],
  });
  await bridge.start();
  const nc = await natsConnect(ctx, st.nats.url, "pub");

  const N = 3000;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("idle", i, `orders.i${i % 4}`));
  const res = await publishAll(nc, msgs, { concurrency: 256, timeout: 10_000 });
  assert.equal(res.failed.size, 0, `publishes not acked: ${res.failed.size}; first: ${JSON.stringify([...res.failed.values()][0])}`);
  const ackedIds = [...res.acked.keys()];
  const idBefore = await mpmcId(st.etcd, st.prefix, "orders");
  const meta = await mpmcMetaLeases(st.etcd, st.prefix, idBefore);
  assert.ok(meta, `mpmc ${idBefore} has a meta`);
  const leases = LEASE_FIELDS.map((f) => ({ field: f, id: meta[f] }));
  for (const l of leases) {
    assert.ok(l.id && l.id !== "0", `meta names a ${l.field}: ${meta.raw}`);
    const info = await st.etcd.leaseInfo(l.id);
    // positive control: the setting reached the channel (else the idle below proves nothing)
    assert.equal(info.grantedTTL, RETENTION_S, `${l.field} ${l.id} granted with the retention`);
  }
  ctx.log(`${ackedIds.length} acked, nobody subscribed; mpmc ${idBefore}; data leases ${leases.map((l) => l.id).join(", ")} (retention ${RETENTION_S} s)`);

  const ex = await bridge.kill9();
  ctx.log(`SIGKILL: ${JSON.stringify(ex)}`);
  await bridge.start();
  // The point of the test: wall-clock time passes with the restarted bridge alone and no traffic,
  // for 2 x retention (longer than every data lease and every member lease of the killed process,
  // 3 x ttl_seconds). It is not a synchronisation wait: the leases are watched the whole time.
  const idleMs = Math.max(2 * RETENTION_S, 3 * TTL) * 1000;
  const t0 = Date.now();
  for (const l of leases) l.min = Infinity;
  while (Date.now() - t0 < idleMs) {
    for (const l of leases) {
      const info = await st.etcd.leaseInfo(l.id);
      const at = ((Date.now() - t0) / 1000).toFixed(1);
      if (info.ttl <= 0) {
        throw new Error(`${l.field} ${l.id} expired ${at} s into the idle window (lowest TTL seen before: ` +
          `${l.min} s): the restarted bridge did not keep the channel alive`);
      }
      l.min = Math.min(l.min, info.ttl);
    }
    await new Promise((r) => setTimeout(r, 250)); // sampling period of the watch, not a sync
  }
  ctx.log(`idle for ${Date.now() - t0} ms (2 x retention) with the restarted bridge alone: ` +
    leases.map((l) => `${l.field} lowest TTL ${l.min} s`).join("; "));

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
    const replaced = (bridge.log().match(/expired \([^\n]*retention[^\n]*/g) || []);
    ctx.log(`crash-idle report: acked ${ackedIds.length}, delivered ${ackedIds.filter(have).length} distinct (${c.records.length} deliveries, ${c.duplicates().length} duplicated ids); mpmc ${idBefore} -> ${idAfter}; replacements logged: ${replaced.length}${replaced.length ? ` ("${replaced[0]}")` : ""}`);
  }
  await waitBacklog(nc, "orders", 0, 20_000);
  assertNoConsumerErrors([c]);
  assertCovers(ackedIds, [...c.counts.keys()], "acked before the crash");
  assert.equal(await mpmcId(st.etcd, st.prefix, "orders"), idBefore, "the channel's MPMC was not replaced");
  const ex2 = await bridge.stop();
  assert.equal(ex2.code, 0, `bridge exit ${JSON.stringify(ex2)}`);
}, { timeout: 120_000 });
