// e2e_redis_restart_no_loss: a Redis payload plane whose redis-server crashes under load loses
// no acked message. Redis runs with an AOF (appendfsync always) and the bridge with
// kv.require_fsync; under a stream of acked publishes (64 in flight, each retried until acked)
// redis-server is killed with SIGKILL, stays down 1.5 s, and restarts on its AOF; afterwards a
// consumer gets every acked message (0 acked lost) and no payload is missing below a produce
// offset. What this proves: the bridge sends a PubAck only after Redis has taken the write into
// its AOF, and it rides out the outage (errors answered, retries acked) and the reload.
// What it does NOT prove: durability on disk. A SIGKILL of the process leaves the kernel's page
// cache intact, so a write Redis made but never fsynced survives it too: this test passes the
// same with appendfsync everysec. Only a power loss or a kernel crash tells `always` from
// `everysec`; that promise rests on Redis's appendfsync always and on kv.require_fsync, which
// this test checks refuses to start against a Redis with appendfsync everysec, naming the setting.
import { setTimeout as delay } from "node:timers/promises";
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, Redis, redisPlane } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishStream, waitBacklog } from "./lib/client.mjs";
import { assert, assertCovers, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_redis_restart_no_loss", async (ctx) => {
  const st = await startStack(ctx);
  // Refusal first: require_fsync against appendfsync everysec.
  const lax = await new Redis(ctx, "redis-lax", { appendfsync: "everysec" }).start();
  const refused = st.bridge({ name: "rf", config: redisPlane(lax, { require_fsync: true }) });
  const r = await refused.tryStart(20_000);
  assert.equal(r.healthy, false, "require_fsync must refuse appendfsync everysec");
  assert.equal(r.exit.code, 2, "a refused setting exits 2 (no systemd restart loop)");
  assert.match(r.output, /kv\.require_fsync: Redis has appendonly yes, appendfsync everysec/);
  await lax.stop();

  const redis = await new Redis(ctx, "redis", { appendfsync: "always" }).start();
  const bridge = st.bridge({ name: "rr", defaults: { ttl_seconds: 30 }, config: redisPlane(redis, { require_fsync: true }) });
  await bridge.start();
  assert.match(bridge.log(), /a PubAck means the message is durable on disk/);

  const pubNc = await natsConnect(ctx, st.nats.url, "pub");
  const KILL_AT = 1500, TOTAL = 4000;
  let killed = null;
  const s = publishStream(pubNc, (n) => makeMsg("rr", n, `orders.x${n % 4}`), {
    concurrency: 64,
    timeout: 6000,
    onAck: (m, ack, count) => {
      if (count === KILL_AT && !killed) {
        killed = (async () => {
          const ex = await redis.kill9();
          ctx.log(`redis SIGKILL at ${count} acks (${JSON.stringify(ex)})`);
          await delay(1500); // fault injection: Redis stays down 1.5 s under the stream
          await redis.start();
          const keys = Number((await redis.cli(["DBSIZE"])).stdout.trim());
          ctx.log(`redis restarted on its AOF (${keys} keys reloaded)`);
          assert.ok(keys > 0, "the AOF was reloaded");
        })();
      }
    },
  });
  await waitFor(() => s.acked.size >= TOTAL, {
    timeout: 120_000, interval: 100, what: () => `acked ${s.acked.size}/${TOTAL}`,
  });
  const res = await s.stop();
  assert.ok(killed, "redis was killed during the stream");
  await killed;
  const errs = Object.fromEntries(res.errCodes);
  ctx.log(`acked ${res.acked.size} of ${res.published} published; error replies during the outage: ${JSON.stringify(errs)}`);
  assert.equal(res.failed.size, 0, `publishes never acked: ${res.failed.size}`);

  const subNc = await natsConnect(ctx, st.nats.url, "sub");
  const c = new Consumer(subNc, "q.orders.rr", { ackMode: "ack" });
  await subNc.flush();
  const ackedIds = [...res.acked.keys()];
  await waitFor(() => ackedIds.every((id) => c.counts.has(id)), {
    timeout: 90_000, interval: 200, what: () => `every acked publish delivered (have ${c.unique}/${ackedIds.length})`,
  });
  await waitBacklog(pubNc, "orders", 0, 30_000);
  assertNoConsumerErrors([c]);
  assertCovers(ackedIds, [...c.counts.keys()], "acked publishes after the Redis crash");
  const missing = (await bridge.metrics()).find((x) => x.name === "fluxon_payload_missing_total");
  assert.equal(missing.value, 0, "no payload lost below a produce offset");
  ctx.log(`delivered ${c.unique} distinct (${c.records.length} deliveries); 0 acked lost`);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
}, { timeout: 240_000 });
