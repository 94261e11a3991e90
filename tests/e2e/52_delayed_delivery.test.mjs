// e2e_delayed_delivery: 1,000 messages with delays spread over 1-10 s (half as Fluxon-Delay, half
// as Nats-Schedule: @at) and 1,000 without, published interleaved on the same subject: the
// undelayed ones flow at once (not held behind the delayed ones), each delayed one arrives not
// before its time and within 1 s after it (times SLOW), none is lost or duplicated, and
// fluxon_delayed_messages counts them while they wait and drops to 0.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, SLOW } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog, channelInfo } from "./lib/client.mjs";
import { assert, assertNoConsumerErrors, assertNoDuplicates } from "./lib/check.mjs";

// The bridge's wall clock and the test's Date.now truncate to whole ms (one machine).
const TRUNC_MS = 2;
const LATE_MS = 1000 * SLOW;
const N = 1000;

export function delayedMetric(text, chan) {
  const m = text.match(new RegExp(`^fluxon_delayed_messages\\{channel="${chan}"\\} (\\d+)`, "m"));
  return m ? Number(m[1]) : null;
}

test("e2e_delayed_delivery", async (ctx) => {
  const st = await startStack(ctx);
  const bridge = await st.bridge({ name: "dly", defaults: { ack_wait: "60s" } }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const c = new Consumer(nc, "q.orders.w");
  await nc.flush();

  // due time per delayed message: relative (Fluxon-Delay) or absolute (Nats-Schedule @at)
  const msgs = [];
  const delayOf = new Map();
  for (let i = 0; i < N; i++) {
    msgs.push(makeMsg("now", i, "orders.x"));
    const d = 1000 + Math.floor((i * 9000) / N); // 1 s .. 10 s
    const m = makeMsg("dly", i, "orders.x");
    m.delayMs = d;
    m.mode = i % 2 ? "at" : "rel";
    delayOf.set(m.id, m);
    msgs.push(m);
  }
  const sent = new Map(); // id -> {t0, t1, due}
  const t0 = Date.now();
  // Headers are set right before each publish so the @at time is relative to its send time.
  const res = await publishAll(nc, msgs.map((m) => ({
    ...m,
    get headers() {
      const now = Date.now();
      if (m.delayMs !== undefined) {
        if (m.mode === "rel") m.headers.set("Fluxon-Delay", `${m.delayMs}ms`);
        else m.headers.set("Nats-Schedule", `@at ${new Date(now + m.delayMs).toISOString()}`);
        sent.set(m.id, { t0: now, due: m.mode === "at" ? now + m.delayMs : null });
      } else {
        sent.set(m.id, { t0: now });
      }
      return m.headers;
    },
  })), {
    concurrency: 64,
    onAck: (m, ack) => {
      const s = sent.get(m.id);
      s.t1 = Date.now();
      s.ack = ack;
    },
  });
  assert.equal(res.failed.size, 0, `every publish acked: ${JSON.stringify([...res.failed.values()].slice(0, 3))}`);
  ctx.log(`published ${msgs.length} in ${Date.now() - t0} ms`);
  for (const [id, m] of delayOf) {
    const a = sent.get(id).ack;
    assert.equal(a.stream, "orders", `PubAck of ${id}`);
    assert.ok(Number.isFinite(a.fluxon_due_ms), `PubAck of delayed ${id} carries fluxon_due_ms: ${JSON.stringify(a)}`);
    if (m.mode === "at") assert.ok(Math.abs(a.fluxon_due_ms - sent.get(id).due) <= 1, `due of ${id}`);
  }

  // Undelayed: all delivered while the delayed ones still wait (the shortest delay is 1 s).
  await waitFor(() => (c.check(), msgs.filter((m) => m.delayMs === undefined).every((m) => c.counts.has(m.id))), { timeout: 10_000 * SLOW, what: "the 1,000 undelayed messages" });
  let lateNow = 0;
  for (const r of c.records) {
    if (delayOf.has(r.id)) continue;
    lateNow = Math.max(lateNow, r.at - sent.get(r.id).t1);
  }
  ctx.log(`undelayed: slowest arrival ${lateNow} ms after its PubAck`);
  assert.ok(lateNow <= 1000 * SLOW, `undelayed messages flow at once (slowest ${lateNow} ms after its PubAck)`);
  const mid = delayedMetric(await bridge.metricsText(), "orders");
  // fluxonctl info's source ($FLUXON.API.CHANNEL.INFO: a count of the index) and stream info
  const info = await channelInfo(nc, "orders");
  const si = await (await nc.jetstreamManager()).streams.info("orders");
  ctx.log(`right after publishing: fluxon_delayed_messages ${mid}, channel info delayed ${info.delayed}, stream info state.fluxon_delayed ${si.state.fluxon_delayed}`);
  assert.ok(info.delayed > 0 && info.delayed <= N, `channel info counts the waiting ones (${info.delayed})`);
  assert.ok(si.state.fluxon_delayed > 0, `stream info shows them (${si.state.fluxon_delayed})`);

  await c.waitUnique(2 * N, 30_000 * SLOW);
  let early = 0, late = 0, worstEarly = 0, worstLate = 0;
  const lateness = [];
  for (const r of c.records) {
    const m = delayOf.get(r.id);
    if (!m) continue;
    const s = sent.get(r.id);
    // rel: due between send + d and ack + d; at: the absolute time
    const lo = m.mode === "at" ? s.due : s.t0 + m.delayMs;
    const hi = m.mode === "at" ? s.due : s.t1 + m.delayMs;
    if (r.at < lo - TRUNC_MS) {
      early++;
      worstEarly = Math.max(worstEarly, lo - r.at);
    }
    if (r.at > hi + LATE_MS) {
      late++;
      worstLate = Math.max(worstLate, r.at - hi);
    }
    lateness.push(r.at - lo);
  }
  lateness.sort((a, b) => a - b);
  ctx.log(`delayed: arrival after due p50 ${lateness[lateness.length >> 1]} ms, p99 ${lateness[Math.floor(lateness.length * 0.99)]} ms, max ${lateness[lateness.length - 1]} ms; early ${early} (worst ${worstEarly} ms), late ${late} (worst ${worstLate} ms)`);
  assert.equal(early, 0, `no delayed message arrives before its time (worst ${worstEarly} ms early)`);
  assert.equal(late, 0, `every delayed message arrives within ${LATE_MS} ms of its time (worst ${worstLate} ms)`);
  assertNoDuplicates([c]);
  assertNoConsumerErrors([c]);
  await waitBacklog(nc, "orders", 0, 15_000 * SLOW);
  // the gauge counted them while they waited and is back to 0
  assert.ok(mid !== null && mid > 0, `fluxon_delayed_messages counted waiting messages (${mid})`);
  await waitFor(async () => delayedMetric(await bridge.metricsText(), "orders") === 0, { timeout: 5000 * SLOW, what: "fluxon_delayed_messages 0" });
  assert.equal((await channelInfo(nc, "orders")).delayed, 0, "channel info: none waiting");
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
});
