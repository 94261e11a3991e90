// e2e_settings_change_applies: changed settings of an existing channel apply or are
// refused, and no acked message is lost either way.
//  1. ttl_seconds 3, retention 1h: 300 acked with nobody subscribed; SIGTERM.
//  2. restart with ttl_seconds 5: it TAKES EFFECT: every member lease of the channel (role keys of
//     producer and consumer, ready keys) is granted 5 s, the data leases named in the MPMC meta
//     (metadata, payload, id-allocator) are granted the retention (3600 s); the 300 + 50 more
//     acked are all delivered. Then 100 acked with nobody subscribed; SIGTERM.
//  3. restart with retention 2h: REFUSED at start, exit code 2, the output names `retention`.
//  4. restart with the original retention: the 100 acked are all delivered.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, mpmcId, memberKeysOf, mpmcMetaLeases, readyKeys, ORDERS } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll } from "./lib/client.mjs";
import { assert, assertCovers, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_settings_change_applies", async (ctx) => {
  const st = await startStack(ctx);
  const settings = { ttl_seconds: 3, retention: "1h" };
  const bridge = st.bridge({
    name: "set",
    defaults: { ack_wait: "5s" },
    // read at every (re)start: the config file is written from the current settings
    config: (cfg) => {
      cfg.channels = [{ ...ORDERS, ...settings }];
    },
  });
  const nc = await natsConnect(ctx, st.nats.url, "pub");
  const publish = async (tag, n) => {
    const msgs = Array.from({ length: n }, (_, i) => makeMsg(tag, i, `orders.${tag}`));
    const res = await publishAll(nc, msgs, { concurrency: 64, timeout: 10_000 });
    assert.equal(res.failed.size, 0, `${tag}: not acked ${res.failed.size}; first: ${JSON.stringify([...res.failed.values()][0])}`);
    return [...res.acked.keys()];
  };
  const deliverAll = async (name, ids, what) => {
    const subNc = await natsConnect(ctx, st.nats.url, name);
    const c = new Consumer(subNc, `q.orders.${name}`);
    await subNc.flush();
    const have = (id) => c.counts.has(id);
    await waitFor(() => (c.check(), ids.every(have)), { timeout: 30_000, interval: 100, what: () => `${what}: ${ids.length} acked delivered (have ${ids.filter(have).length})` });
    assertNoConsumerErrors([c]);
    assertCovers(ids, [...c.counts.keys()], what);
    return { c, subNc };
  };

  // 1. the channel is created with ttl_seconds 3, retention 1h
  await bridge.start();
  const batch1 = await publish("s1", 300);
  const id = await mpmcId(st.etcd, st.prefix, "orders");
  let ex = await bridge.stop();
  assert.equal(ex.code, 0, `stop 1: ${JSON.stringify(ex)}`);

  // 2. ttl_seconds 3 -> 5 takes effect
  settings.ttl_seconds = 5;
  let r = await bridge.tryStart();
  assert.ok(r.healthy, `restart with ttl_seconds 5 refused: exit ${JSON.stringify(r.exit)}: ${(r.output || "").slice(-600)}`);
  const batch2 = await publish("s2", 50);
  const subNc2 = await natsConnect(ctx, st.nats.url, "ttl");
  const c2 = new Consumer(subNc2, "q.orders.ttl");
  await subNc2.flush();
  let seen = [];
  try {
    await waitFor(async () => {
      const keys = await memberKeysOf(st.etcd, st.prefix, id);
      seen = await Promise.all(keys.map(async (k) => ({ key: k.key, lease: k.lease, granted: k.lease === "0" ? 0 : (await st.etcd.leaseInfo(k.lease)).grantedTTL })));
      const has = (part) => seen.some((s) => s.key.includes(`/mpmc_channels/${part}/${id}/`));
      return has("producer") && has("consumer") && has("ready") && seen.every((s) => s.granted === 5);
    }, { timeout: 10_000, interval: 200, what: "producer, consumer and ready keys, every one on a lease granted ttl_seconds 5" });
  } finally {
    ctx.log(`member keys after the ttl change: ${seen.map((s) => `${s.key.slice(st.prefix.length)} lease ${s.lease} granted ${s.granted}s`).join("; ")}`);
  }
  const meta = await mpmcMetaLeases(st.etcd, st.prefix, id);
  assert.ok(meta, `MPMC meta ${id} present`);
  const data = {};
  for (const f of ["metadata_lease_id", "payload_lease_id", "id_allocator_cluster_lease_id"]) {
    data[f] = meta[f] ? (await st.etcd.leaseInfo(meta[f])).grantedTTL : null;
  }
  ctx.log(`data leases (MPMC meta ${meta.raw}): granted ${JSON.stringify(data)}`);
  for (const [f, g] of Object.entries(data)) assert.equal(g, 3600, `${f} of the MPMC meta: granted TTL ${g} s, want the retention 1h = 3600 s`);
  const have2 = (x) => c2.counts.has(x);
  const want2 = [...batch1, ...batch2];
  await waitFor(() => (c2.check(), want2.every(have2)), { timeout: 30_000, interval: 100, what: () => `after the ttl change: ${want2.length} acked delivered (have ${want2.filter(have2).length})` });
  assertNoConsumerErrors([c2]);
  await c2.unsubscribe();
  await waitFor(async () => (await readyKeys(st.etcd, st.prefix, "orders")).length === 0, { timeout: 10_000, what: "claim released after the subscriber left" });
  const batch3 = await publish("s3", 100);
  ex = await bridge.stop();
  assert.equal(ex.code, 0, `stop 2: ${JSON.stringify(ex)}`);

  // 3. retention 1h -> 2h is refused at start, naming the setting
  settings.retention = "2h";
  r = await bridge.tryStart();
  if (r.healthy) {
    const ex3 = await bridge.stop();
    assert.fail(`the bridge started with retention changed from 1h to 2h for existing channel orders (stopped: ${JSON.stringify(ex3)}); want exit 2 naming retention`);
  }
  ctx.log(`retention change: exit ${JSON.stringify(r.exit)}; output: ${r.output.trim().split("\n").filter((l) => !l.startsWith("----")).slice(-3).join(" | ")}`);
  assert.equal(r.exit.code, 2, `exit of the refused start: ${JSON.stringify(r.exit)}`);
  // the bridge's own lines (not the harness's "---- start: <command>" line)
  assert.match(r.output.split("\n").filter((l) => !l.startsWith("----")).join("\n"), /retention/, "the refusal names the setting");

  // 4. back to the original retention: the backlog is intact
  settings.retention = "1h";
  r = await bridge.tryStart();
  assert.ok(r.healthy, `restart with the original retention refused: exit ${JSON.stringify(r.exit)}: ${(r.output || "").slice(-600)}`);
  await deliverAll("back", batch3, "after the refused retention change");
  ex = await bridge.stop();
  assert.equal(ex.code, 0, `stop 4: ${JSON.stringify(ex)}`);
}, { timeout: 120_000 });
