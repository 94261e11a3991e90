// e2e_redis_evicting_policy_refused: Redis may evict a channel's whole backlog (one key) under any
// volatile-* / allkeys-* maxmemory-policy, so the Redis plane accepts only noeviction:
//  - at start: with volatile-lru, and with allkeys-lru, the bridge exits 2 naming the policy;
//  - at runtime (CONFIG SET maxmemory-policy volatile-lru on a running bridge's Redis): an ERR
//    line naming the policy within one re-check period (2 s) plus slack, publishes sent after it
//    get a 503 (none acked), fluxon_kv_redis_refusing_writes is 1; back to noeviction, publishes
//    are acked again and every acked message is delivered, none skipped as missing.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, Redis, redisPlane } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAcked, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert, assertSameSet, assertNoConsumerErrors } from "./lib/check.mjs";

const metric = async (b, name) => ((await b.metrics()).find((s) => s.name === name) || {}).value;

test("e2e_redis_evicting_policy_refused", async (ctx) => {
  const st = await startStack(ctx);
  for (const policy of ["volatile-lru", "allkeys-lru"]) {
    const r = await new Redis(ctx, `redis-${policy}`, { args: ["--maxmemory", "64mb", "--maxmemory-policy", policy] }).start();
    const b = st.bridge({ name: `ev-${policy}`, config: redisPlane(r) });
    const res = await b.tryStart(20_000);
    ctx.log(`${policy}: ${res.healthy ? "started" : `exit ${JSON.stringify(res.exit)}`}: ${(res.output || "").split("\n").find((l) => l.includes("[ERR]")) || ""}`);
    assert.equal(res.healthy, false, `the bridge must not start on maxmemory-policy ${policy}`);
    assert.equal(res.exit.code, 2, `exit code 2 (a refused setting): ${JSON.stringify(res.exit)}`);
    assert.match(res.output, new RegExp(`\\[ERR\\].*maxmemory-policy ${policy}`), "the error names the policy");
    await r.stop();
  }

  const redis = await new Redis(ctx, "redis", { args: ["--maxmemory", "64mb"] }).start(); // noeviction
  const bridge = st.bridge({ name: "ev", config: redisPlane(redis) });
  await bridge.start();
  const pubNc = await natsConnect(ctx, st.nats.url, "pub");
  const before = Array.from({ length: 100 }, (_, i) => makeMsg("ev", i, "orders.e"));
  const r1 = await publishAll(pubNc, before, { concurrency: 16, timeout: 10_000 });
  assert.equal(r1.acked.size, before.length);

  await redis.cli(["CONFIG", "SET", "maxmemory-policy", "volatile-lru"]);
  const t0 = Date.now();
  await waitFor(() => /\[ERR\] kv redis: refusing writes.*maxmemory-policy volatile-lru/.test(bridge.log()),
    { timeout: 2000 + 1500, what: "an ERR line naming the policy within one re-check period" });
  ctx.log(`ERR line ${Date.now() - t0} ms after CONFIG SET`);
  const during = Array.from({ length: 16 }, (_, i) => makeMsg("ev", 1000 + i, "orders.e"));
  const replies = await Promise.all(during.map((m) => publishAcked(pubNc, m, 15_000)));
  for (const r of replies) {
    assert.equal(r.ok, false, "no publish is acked while the policy evicts");
    assert.equal(r.code, 503, `error reply: ${JSON.stringify(r)}`);
  }
  await waitFor(async () => (await metric(bridge, "fluxon_kv_redis_refusing_writes")) === 1 &&
    (await metric(bridge, "fluxon_kv_redis_writes_refused_total")) > 0, { timeout: 5000, what: "refusal gauge and counter (refreshed every second)" });

  await redis.cli(["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
  const after = Array.from({ length: 100 }, (_, i) => makeMsg("ev", 2000 + i, "orders.e"));
  const r2 = await publishAll(pubNc, after, { concurrency: 16, timeout: 10_000, retry: true, deadline: 20_000 });
  assert.equal(r2.acked.size, after.length, "acked again once noeviction is back");
  await waitFor(async () => (await metric(bridge, "fluxon_kv_redis_refusing_writes")) === 0, { timeout: 5000, what: "refusal gauge back to 0" });

  const subNc = await natsConnect(ctx, st.nats.url, "sub");
  const c = new Consumer(subNc, "q.orders.e", { ackMode: "ack" });
  await subNc.flush();
  const acked = [...r1.acked.keys(), ...r2.acked.keys()];
  await waitFor(() => acked.every((id) => c.counts.has(id)), { timeout: 30_000, what: () => `acked delivered (${c.unique}/${acked.length})` });
  await waitBacklog(pubNc, "orders", 0, 30_000);
  assertNoConsumerErrors([c]);
  assertSameSet(acked, [...c.counts.keys()], "delivered = acked (the refused ones were never stored)");
  assert.equal(await metric(bridge, "fluxon_payload_missing_total"), 0, "nothing skipped as missing");
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
}, { timeout: 120_000 });
