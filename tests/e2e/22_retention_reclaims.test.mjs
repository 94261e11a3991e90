// e2e_retention_reclaims: channel "orders" has `retention` 4s (ttl_seconds 2); a second
// channel "keep" has the default retention (7d). Both hold acked messages; then the bridge stops
// and NO bridge runs: for the retention, then until orders' keys are gone (polled, at most 3 x
// retention in all, times the slow factor). By then every key of orders' MPMC is gone from etcd (MPMC
// meta and lists, role/ready keys, member-id counter, its sub-MPSCs' metas, memberships, offsets,
// counters and cluster-lease keys) and so are its payload keys in the KV store (etcd, R/kv/), as
// the lease rule says (docs/ARCHITECTURE.md "Leases") -- and so are those of orders-dlq (same settings). The "keep" channel,
// whose retention has not passed, still has its meta and every payload. The name mapping
// R/mq_unique_keys/orders is unleased and may remain; it is reported, not asserted.
import { test } from "./lib/runner.mjs";
import { startStack, mpmcId, subMpscIds, allKeys, belongsToMpmc, waitFor, ORDERS } from "./lib/stack.mjs";
import { natsConnect, makeMsg, publishAll } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

test("e2e_retention_reclaims", async (ctx) => {
  const RETENTION_S = 4;
  const st = await startStack(ctx);
  const KEEP = { name: "keep", subjects: ["keep.>"], deliver_prefix: "q.keep" };
  const bridge = st.bridge({
    name: "ret",
    defaults: { ttl_seconds: 2 },
    channels: [{ ...ORDERS, retention: `${RETENTION_S}s` }, KEEP],
  });
  await bridge.start();
  const nc = await natsConnect(ctx, st.nats.url, "pub");
  const N = 200;
  const msgs = [
    ...Array.from({ length: N }, (_, i) => makeMsg("ret", i, `orders.r${i % 2}`)),
    ...Array.from({ length: N }, (_, i) => makeMsg("keep", i, `keep.k${i % 2}`)),
  ];
  const res = await publishAll(nc, msgs, { concurrency: 64, timeout: 10_000 });
  assert.equal(res.failed.size, 0, `publishes not acked: ${res.failed.size}; first: ${JSON.stringify([...res.failed.values()][0])}`);

  // What each channel owns while the bridge runs.
  const chans = {};
  for (const name of ["orders", "orders-dlq", "keep"]) {
    const id = await mpmcId(st.etcd, st.prefix, name);
    const subs = id === null ? [] : await subMpscIds(st.etcd, st.prefix, id);
    chans[name] = { id, subs };
  }
  const owned = (name, keys) => {
    const c = chans[name];
    return c.id === null ? [] : keys.filter((k) => belongsToMpmc(k.key, st.prefix, c.id, c.subs));
  };
  const before = await allKeys(st.etcd, st.prefix);
  const kvOf = (name, keys) => owned(name, keys).filter((k) => k.key.startsWith(`${st.prefix}/kv/`));
  for (const name of ["orders", "keep"]) {
    const c = chans[name];
    assert.ok(c.id !== null, `channel ${name} has an MPMC`);
    assert.ok(c.subs.length > 0, `channel ${name} has sub-MPSCs`);
    assert.ok(kvOf(name, before).length > 0, `channel ${name}: no payload key before the stop (${N} messages)`);
  }
  ctx.log(`before: ${Object.entries(chans).map(([n, c]) => `${n}: mpmc ${c.id} subs [${c.subs}] ${owned(n, before).length} keys`).join("; ")}; ${before.length} keys under ${st.prefix}/`);

  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `SIGTERM exit ${JSON.stringify(ex)}`);
  // The point of the test: no bridge at all, for longer than the retention (the fault's shape:
  // nothing may be reclaimed by a bridge), then until etcd has expired what the retention covers
  // (polled with a deadline: etcd's lease expiry is the other process this waits for).
  const t0 = Date.now();
  await new Promise((r) => setTimeout(r, RETENTION_S * 1000));
  let after = [];
  await waitFor(async () => {
    after = await allKeys(st.etcd, st.prefix);
    return owned("orders", after).length === 0 && owned("orders-dlq", after).length === 0;
  }, { timeout: 2 * RETENTION_S * 1000, interval: 250, what: "orders' and orders-dlq's keys expired" }).catch(() => {
    /* reported below, key by key */
  });
  ctx.log(`no bridge for ${Date.now() - t0} ms (retention ${RETENTION_S} s); ${after.length} keys remain under ${st.prefix}/`);
  const mapping = after.filter((k) => k.key === `${st.prefix}/mq_unique_keys/orders`);
  ctx.log(`name mapping of orders: ${mapping.length ? `kept (${mapping[0].value}, lease ${mapping[0].lease})` : "removed"}`);

  const show = (ks) => ks.slice(0, 40).map((k) => `${k.key} (lease ${k.lease})`).join("\n    ") + (ks.length > 40 ? `\n    ... (${ks.length})` : "");
  // Every finding is collected first, so that one run shows all of them.
  const problems = [];
  for (const name of ["orders", "orders-dlq"]) {
    const left = owned(name, after);
    if (left.length) problems.push(`${name} (retention ${RETENTION_S}s, mpmc ${chans[name].id}): ${left.length} key(s) still in etcd ${Date.now() - t0} ms without a bridge (3 x retention x the slow factor):\n    ${show(left)}`);
  }
  // The channel whose retention (7d) has not passed keeps its data.
  const k = chans.keep;
  const keepMeta = after.some((kv) => kv.key === `${st.prefix}/mpmc_channels/${k.id}/meta`);
  const keepKv = kvOf("keep", after).length;
  const keepKvBefore = kvOf("keep", before).length;
  if (!keepMeta) problems.push(`keep (default retention): MPMC meta ${k.id} gone after ${Date.now() - t0} ms without a bridge`);
  if (keepKv !== keepKvBefore) problems.push(`keep (default retention): ${keepKv} of ${keepKvBefore} payload keys (segments of ${N} messages) left`);
  assert.ok(problems.length === 0, problems.join("\n  "));
}, { timeout: 60_000 });
