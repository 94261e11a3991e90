// e2e_redis_plane_publish_consume: a bridge on the Redis payload plane (kv.backend "redis"):
// 10,000 publishes acked while no one consumes (the payloads sit in Redis, none in etcd), then a
// consumer gets every one exactly once; the bridge says at start what a PubAck means for this
// Redis (appendfsync everysec); the backlog ends at 0 and Redis holds no payload afterwards.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, Redis, redisPlane } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert, assertSameSet, assertNoDuplicates, assertNoConsumerErrors } from "./lib/check.mjs";

/** Payload members in Redis under the bridge's kv prefix (lease sets minus their markers). */
export async function redisPayloads(redis, prefix) {
  const keys = (await redis.cli(["--scan", "--pattern", `${prefix}/kv/l:*`])).stdout.split("\n").filter(Boolean);
  let n = 0;
  for (const k of keys) n += Math.max(0, Number((await redis.cli(["ZCARD", k])).stdout.trim()) - 1);
  return n;
}

test("e2e_redis_plane_publish_consume", async (ctx) => {
  const st = await startStack(ctx);
  const redis = await new Redis(ctx, "redis", { appendfsync: "everysec" }).start();
  const bridge = st.bridge({ name: "rp", config: redisPlane(redis) });
  await bridge.start();
  const log = bridge.log();
  assert.match(log, /payload plane: redis/, "the bridge names its payload plane");
  assert.match(log, /appendfsync everysec.*up to 1 s of acked messages may be lost/, "PubAck meaning logged");

  const pubNc = await natsConnect(ctx, st.nats.url, "pub");
  const N = 10_000;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("rp", i, `orders.r${i % 3}`));
  const t0 = Date.now();
  const res = await publishAll(pubNc, msgs, { concurrency: 256, timeout: 30_000 });
  const pubMs = Date.now() - t0;
  assert.equal(res.failed.size, 0, `failed publishes: ${[...res.failed].slice(0, 3).map(([id, r]) => `${id}: ${r.error}`).join("; ")}`);
  assert.equal(res.acked.size, N);
  ctx.log(`published ${N} acked in ${pubMs} ms (Redis plane)`);

  // Stored in Redis, not in etcd.
  const inRedis = await redisPayloads(redis, st.prefix);
  const inEtcd = (await st.etcd.range(`${st.prefix}/kv/`)).length;
  ctx.log(`payload entries: Redis ${inRedis} (segments), etcd ${inEtcd}`);
  assert.ok(inRedis > 0, "payloads are in Redis");
  assert.equal(inEtcd, 0, "no payload in etcd");

  const subNc = await natsConnect(ctx, st.nats.url, "sub");
  const c = new Consumer(subNc, "q.orders.r", { ackMode: "ack" });
  await subNc.flush();
  await waitFor(() => c.unique >= N, { timeout: 120_000, interval: 100, what: () => `every message delivered (have ${c.unique}/${N})` });
  ctx.log(`received ${N} in ${Date.now() - t0} ms from the first publish`);
  await waitBacklog(pubNc, "orders", 0, 30_000);
  assertNoConsumerErrors([c]);
  assertSameSet(msgs.map((m) => m.id), [...c.counts.keys()], "delivered");
  assertNoDuplicates([c]);
  // Acked payloads are deleted from Redis.
  await waitFor(async () => (await redisPayloads(redis, st.prefix)) === 0, { timeout: 15_000, what: "Redis payloads deleted after the acks" });
  const series = await bridge.metrics();
  const missing = series.find((s) => s.name === "fluxon_payload_missing_total");
  assert.ok(missing, "fluxon_payload_missing_total is exported");
  assert.equal(missing.value, 0);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
}, { timeout: 240_000 });
