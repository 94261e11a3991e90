// e2e_redis_persistence_rechecked: kv.require_fsync is not a start-only check. A bridge started on
// a Redis with appendfsync always; CONFIG SET appendfsync everysec at runtime: within one re-check
// period (2 s) plus slack an ERR line names kv.require_fsync and what Redis has, publishes sent
// after it get a 503 (none acked); CONFIG SET appendfsync always again: publishes are acked again
// without a restart, and every acked message is delivered (none skipped as missing).
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, Redis, redisPlane } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAcked, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert, assertSameSet, assertNoConsumerErrors } from "./lib/check.mjs";

const metric = async (b, name) => ((await b.metrics()).find((s) => s.name === name) || {}).value;

test("e2e_redis_persistence_rechecked", async (ctx) => {
  const st = await startStack(ctx);
  const redis = await new Redis(ctx, "redis", { appendfsync: "always" }).start();
  const bridge = st.bridge({ name: "pr", config: redisPlane(redis, { require_fsync: true }) });
  await bridge.start();
  const pubNc = await natsConnect(ctx, st.nats.url, "pub");
  const before = Array.from({ length: 100 }, (_, i) => makeMsg("pr", i, "orders.p"));
  const r1 = await publishAll(pubNc, before, { concurrency: 16, timeout: 10_000 });
  assert.equal(r1.acked.size, before.length);

  await redis.cli(["CONFIG", "SET", "appendfsync", "everysec"]);
  const t0 = Date.now();
  await waitFor(() => /\[ERR\] kv redis: refusing writes.*kv\.require_fsync: Redis has appendonly yes, appendfsync everysec/.test(bridge.log()),
    { timeout: 2000 + 1500, what: "an ERR line naming kv.require_fsync within one re-check period" });
  ctx.log(`ERR line ${Date.now() - t0} ms after CONFIG SET`);
  const during = Array.from({ length: 16 }, (_, i) => makeMsg("pr", 1000 + i, "orders.p"));
  const replies = await Promise.all(during.map((m) => publishAcked(pubNc, m, 15_000)));
  for (const r of replies) {
    assert.equal(r.ok, false, "no publish is acked while Redis does not fsync every write");
    assert.equal(r.code, 503, `error reply: ${JSON.stringify(r)}`);
  }
  await waitFor(async () => (await metric(bridge, "fluxon_kv_redis_refusing_writes")) === 1, { timeout: 5000, what: "refusal gauge (refreshed every second)" });

  await redis.cli(["CONFIG", "SET", "appendfsync", "always"]);
  await waitFor(() => /\[INF\] kv redis: .* holds again: writes accepted/.test(bridge.log()), { timeout: 5000, what: "the guard holds again" });
  const after = Array.from({ length: 100 }, (_, i) => makeMsg("pr", 2000 + i, "orders.p"));
  const r2 = await publishAll(pubNc, after, { concurrency: 16, timeout: 10_000, retry: true, deadline: 20_000 });
  assert.equal(r2.acked.size, after.length, "acked again once appendfsync always is back");

  const subNc = await natsConnect(ctx, st.nats.url, "sub");
  const c = new Consumer(subNc, "q.orders.p", { ackMode: "ack" });
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
