// e2e_full_channel_fast_fail: a full channel answers a publish at once with JetStream's shape
// {"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}} (what a
// JetStream client shows for a full stream), instead of holding the publisher for seconds; the
// npm client's js.publish() reports that err_code. A publish without a reply subject that finds
// the channel full is counted in fluxon_full_dropped_total. With the channel setting full_wait
// the publish waits that long for room (here: none comes, so the same error after the wait).
// "At once" is a bound of FAST_MS (250 ms, times the slow-build factor): far below the seconds a
// publisher held for room would wait, well above a loaded machine's round trip.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, metricValue, SLOW } from "./lib/stack.mjs";
import { natsConnect, makeMsg, publishAcked, waitBacklog } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

const FAST_MS = 250 * SLOW;

test("e2e_full_channel_fast_fail", async (ctx) => {
  const st = await startStack(ctx);
  const bridge = await st.bridge({ name: "full", defaults: { capacity: 3 } }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const js = nc.jetstream();

  // Nobody consumes: three publishes fill the channel.
  for (let i = 0; i < 3; i++) {
    const r = await publishAcked(nc, makeMsg("full", i, "orders.fill"));
    assert.ok(r.ok, `publish ${i}: ${JSON.stringify(r)}`);
  }
  await waitBacklog(nc, "orders", 3);
  // The fourth: answered at once, with JetStream's error shape.
  for (let i = 3; i < 6; i++) {
    const t0 = performance.now();
    const r = await publishAcked(nc, makeMsg("full", i, "orders.fill"), 5000);
    const ms = performance.now() - t0;
    ctx.log(`publish ${i} into the full channel: ${ms.toFixed(1)} ms, ${JSON.stringify(r.reply || r)}`);
    assert.equal(r.ok, false, `publish ${i} must fail: the channel is full`);
    assert.deepEqual(r.reply, { error: { code: 503, err_code: 10077, description: "maximum messages exceeded" } },
      "JetStream's error for a full stream");
    assert.ok(ms < FAST_MS, `answered in ${ms.toFixed(1)} ms (< ${FAST_MS} ms)`);
  }
  // The JetStream client surfaces the err_code.
  const t1 = performance.now();
  await assert.rejects(js.publish("orders.fill", new Uint8Array(1), { timeout: 5000 }), (e) => {
    ctx.log(`js.publish error: ${e.message} api_error ${JSON.stringify(e.api_error)}`);
    return e.api_error && e.api_error.err_code === 10077 && e.api_error.code === 503;
  });
  const jsMs = performance.now() - t1;
  assert.ok(jsMs < FAST_MS, `js.publish failed fast: ${jsMs.toFixed(1)} ms (< ${FAST_MS} ms)`);

  // Fire and forget into the full channel: dropped and counted.
  for (let i = 0; i < 2; i++) nc.publish("orders.fill", new Uint8Array([i]));
  await nc.flush();
  await waitFor(async () => metricValue(await bridge.metrics(), "fluxon_full_dropped_total", { channel: "orders" }) === 2,
    { timeout: 5000, what: "fluxon_full_dropped_total{channel=orders} = 2" });
  await waitBacklog(nc, "orders", 3);

  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();

  // full_wait 1s (a channel setting): the publish waits for room for a second before giving up.
  const waiting = { name: "slow", subjects: ["slow.>"], deliver_prefix: "q.slow", full_wait: "1s" };
  const b2 = await st.bridge({ name: "wait", defaults: { capacity: 3 }, channels: [waiting] }).start();
  for (let i = 0; i < 3; i++) assert.ok((await publishAcked(nc, makeMsg("slow", i, "slow.fill"))).ok);
  const t2 = performance.now();
  const r = await publishAcked(nc, makeMsg("slow", 3, "slow.fill"), 5000);
  const waited = performance.now() - t2;
  ctx.log(`full_wait 1s: answered after ${waited.toFixed(0)} ms: ${JSON.stringify(r.reply || r)}`);
  assert.equal(r.reply && r.reply.error && r.reply.error.err_code, 10077);
  assert.ok(waited >= 900 && waited < 1000 + 2000 * SLOW, `waited ${waited.toFixed(0)} ms for room (full_wait 1s)`);

  const ex2 = await b2.stop();
  assert.equal(ex2.code, 0, `bridge exit ${JSON.stringify(ex2)}`);
  b2.assertLogClean();
}, { timeout: 120_000 });
