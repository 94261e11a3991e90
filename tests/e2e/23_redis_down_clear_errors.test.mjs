// e2e_redis_down_clear_errors: with the Redis payload plane down (redis-server killed), publishes
// are answered with a 503 PubAck error naming the unavailable store, each within the bridge's put
// timeout (4 s) plus slack; /healthz stays answering; once Redis is back (restarted on its AOF),
// publishing works again without restarting the bridge (its own counters and uptime span the
// outage), and every acked message is delivered.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, Redis, redisPlane, metricValue } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAcked, publishAll, waitBacklog, adminRequest } from "./lib/client.mjs";
import { assert, assertSameSet, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_redis_down_clear_errors", async (ctx) => {
  const st = await startStack(ctx);
  const redis = await new Redis(ctx, "redis", { appendfsync: "always" }).start();
  const bridge = st.bridge({ name: "rd", defaults: { ttl_seconds: 30 }, config: redisPlane(redis) });
  await bridge.start();
  const pubNc = await natsConnect(ctx, st.nats.url, "pub");
  const before = Array.from({ length: 50 }, (_, i) => makeMsg("rd", i, "orders.d"));
  const r1 = await publishAll(pubNc, before, { concurrency: 16, timeout: 10_000 });
  assert.equal(r1.acked.size, 50);

  await redis.kill9();
  const down = Array.from({ length: 16 }, (_, i) => makeMsg("rd", 1000 + i, "orders.d"));
  const t0 = Date.now();
  const replies = await Promise.all(down.map(async (m) => {
    const t = Date.now();
    const r = await publishAcked(pubNc, m, 15_000);
    return { ...r, ms: Date.now() - t };
  }));
  ctx.log(`while Redis is down: ${replies.length} replies in ${Date.now() - t0} ms; first: ${JSON.stringify({ code: replies[0].code, error: replies[0].error, ms: replies[0].ms })}`);
  for (const r of replies) {
    assert.equal(r.ok, false, "no PubAck success while the payload store is down");
    assert.equal(r.code, 503, `error code: ${JSON.stringify(r)}`);
    assert.match(r.error, /store unavailable/);
    assert.ok(r.ms <= 4000 + 1500, `answered within the put timeout (+slack): ${r.ms} ms`);
  }
  const h = await bridge.health();
  assert.ok(h.status === 200 || h.status === 503, `/healthz answers while Redis is down (${h.status})`);

  await redis.start();
  const after = Array.from({ length: 200 }, (_, i) => makeMsg("rd", 2000 + i, "orders.d"));
  const r2 = await publishAll(pubNc, after, { concurrency: 32, timeout: 10_000, retry: true, deadline: 30_000 });
  assert.equal(r2.acked.size, after.length, `after Redis returned: ${r2.failed.size} failed: ${JSON.stringify([...r2.failed.values()][0])}`);
  // Not restarted, from the bridge's own side (the harness never restarts it; a bridge that
  // restarted itself, even keeping its pid with a re-exec, would start its counters and uptime
  // again): its counters span the outage -- every message it stored before Redis died and every
  // one after, and each publish refused while Redis was down counted as a store error.
  assert.ok(bridge.proc.running, "the same bridge process serves");
  const ms = await bridge.metrics();
  const stored = metricValue(ms, "fluxon_stored_total", { channel: "orders" }) || 0;
  const storeErrors = metricValue(ms, "fluxon_store_errors_total", { channel: "orders" }) || 0;
  const sinceOutage = Date.now() - t0; // taken before the bridge measures its uptime
  const info = await adminRequest(pubNc, "$FLUXON.API.INFO");
  ctx.log(`bridge counters after the outage: stored ${stored}, store errors ${storeErrors}; uptime ${info.uptime_ms} ms (outage began ${sinceOutage} ms before)`);
  assert.ok(stored >= before.length + after.length, `fluxon_stored_total ${stored} < ${before.length} before + ${after.length} after the outage: the bridge's counters started again`);
  assert.ok(storeErrors >= down.length, `fluxon_store_errors_total ${storeErrors} < the ${down.length} publishes refused while Redis was down`);
  assert.ok(info.uptime_ms >= sinceOutage, `bridge uptime ${info.uptime_ms} ms is shorter than the time since Redis died (${sinceOutage} ms)`);
  ctx.log(`after Redis returned: ${after.length} acked (${[...r2.attempts.values()].filter((a) => a > 1).length} needed a retry)`);

  const subNc = await natsConnect(ctx, st.nats.url, "sub");
  const c = new Consumer(subNc, "q.orders.rd", { ackMode: "ack" });
  await subNc.flush();
  const acked = [...r1.acked.keys(), ...r2.acked.keys()];
  await waitFor(() => acked.every((id) => c.counts.has(id)), { timeout: 60_000, what: () => `acked delivered (${c.unique}/${acked.length})` });
  await waitBacklog(pubNc, "orders", 0, 30_000);
  assertNoConsumerErrors([c]);
  assertSameSet(acked, [...c.counts.keys()], "delivered = acked (the refused ones were never stored)");
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
}, { timeout: 180_000 });
