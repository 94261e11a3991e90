// e2e_redis_full_answers_503: a full Redis refuses puts. Redis with maxmemory 4mb and noeviction,
// nobody consuming; about 10 MB of 4 KiB publishes: once Redis is full, publishes are answered
// with JetStream's "insufficient resources" (503, err_code 10023), Redis's used_memory (sampled
// every 50 ms) stays within maxmemory plus one batch (the bridge's largest payload put, 1 MiB),
// and every acked message is delivered once a consumer comes (nothing acked is lost).
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, Redis, redisPlane } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert, assertSameSet, assertNoConsumerErrors } from "./lib/check.mjs";

const MAXMEM = 4 * 1024 * 1024;
const BATCH = 1024 * 1024; // CHUNK_BYTES: the largest payload put (one segment)

test("e2e_redis_full_answers_503", async (ctx) => {
  const st = await startStack(ctx);
  const redis = await new Redis(ctx, "redis", { args: ["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"] }).start();
  const bridge = st.bridge({ name: "full", config: redisPlane(redis) });
  await bridge.start();
  const usedMemory = async () => {
    const m = /used_memory:(\d+)/.exec((await redis.cli(["INFO", "memory"])).stdout);
    return m ? Number(m[1]) : -1;
  };
  let peak = await usedMemory();
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      peak = Math.max(peak, await usedMemory());
      await new Promise((r) => setTimeout(r, 50));
    }
  })();

  const pubNc = await natsConnect(ctx, st.nats.url, "pub");
  const pad = "x".repeat(4000);
  const N = 2560; // 2560 x 4 KiB = 10 MiB
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("full", i, "orders.f", { "X-Pad": pad }));
  const t0 = Date.now();
  const res = await publishAll(pubNc, msgs, { concurrency: 64, timeout: 15_000 });
  sampling = false;
  await sampler;
  peak = Math.max(peak, await usedMemory());
  const codes = {};
  for (const r of res.failed.values()) {
    const k = `${r.code}/${r.reply?.error?.err_code ?? "-"}`;
    codes[k] = (codes[k] || 0) + 1;
  }
  ctx.log(`${res.acked.size} acked, ${res.failed.size} refused ${JSON.stringify(codes)} in ${Date.now() - t0} ms; used_memory peak ${peak} (maxmemory ${MAXMEM}, + one batch ${MAXMEM + BATCH})`);
  assert.ok(res.acked.size > 0 && res.acked.size < N, `some acked, not all (${res.acked.size}/${N})`);
  for (const r of res.failed.values()) {
    assert.equal(r.code, 503, `refusal code: ${JSON.stringify(r)}`);
    assert.equal(r.reply?.error?.err_code, 10023, `JetStream insufficient resources: ${JSON.stringify(r)}`);
    assert.match(r.error, /insufficient resources/);
  }
  assert.ok(peak <= MAXMEM + BATCH, `used_memory peak ${peak} <= maxmemory + one batch (${MAXMEM + BATCH})`);
  let oom = 0; // metrics are refreshed once a second
  await waitFor(async () => (oom = ((await bridge.metrics()).find((s) => s.name === "fluxon_kv_redis_oom_total") || {}).value) > 0,
    { timeout: 5000, what: () => `fluxon_kv_redis_oom_total counts the refusals (${oom})` });

  const subNc = await natsConnect(ctx, st.nats.url, "sub");
  const c = new Consumer(subNc, "q.orders.f", { ackMode: "ack" });
  await subNc.flush();
  const acked = [...res.acked.keys()];
  await waitFor(() => acked.every((id) => c.counts.has(id)), { timeout: 60_000, what: () => `acked delivered (${c.unique}/${acked.length})` });
  await waitBacklog(pubNc, "orders", 0, 30_000);
  assertNoConsumerErrors([c]);
  assertSameSet(acked, [...c.counts.keys()], "delivered = acked (the refused ones were never stored)");
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
}, { timeout: 150_000 });
