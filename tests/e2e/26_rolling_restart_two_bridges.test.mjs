// e2e_rolling_restart_two_bridges: two bridges, an acked publish stream that never
// stops (each publish retried until acked), subscribers on two names (each bridge claims for
// both). Each bridge is restarted in turn while the load continues: first SIGTERM + start (L, then
// R), then SIGKILL + start (L, then R). While the load still runs, every message acked so far is
// delivered within ttl_seconds + ack_wait + 5 s (a killed bridge's backlog does not wait for the
// load to stop); after the load, 0 acked messages lost; duplicates are bounded by what was in
// flight at each SIGKILL and none comes from a SIGTERM restart (rollingDuplicates below).
// Acked messages dead-lettered before the restarts (parked in orders-dlq, which nobody publishes to
// or reads meanwhile) are all delivered to a dead-letter subscriber afterwards.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, metricValue, mpmcId, DEFAULTS } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, publishStream, waitBacklog } from "./lib/client.mjs";
import { assert, assertCovers, assertNoConsumerErrors, mergedCounts } from "./lib/check.mjs";

test("e2e_rolling_restart_two_bridges", async (ctx) => {
  const defaults = { ttl_seconds: 2, ack_wait: "3s", release_after: "1s", interest_poll: "200ms", max_deliver: 2, backoff: ["100ms"] };
  const st = await startStack(ctx);
  const L = st.bridge({ name: "L", defaults });
  const R = st.bridge({ name: "R", defaults });
  await Promise.all([L.start(), R.start()]);
  const xNc = await natsConnect(ctx, st.nats.url, "x");
  const yNc = await natsConnect(ctx, st.nats.url, "y");
  // "dead-*" messages are refused (-NAK) until they are dead-lettered; everything else is acked
  const nakDead = (m, rec) => (rec.id && rec.id.startsWith("dead-") ? "-NAK" : "+ACK");
  const x = new Consumer(xNc, "q.orders.x", { ackMode: nakDead });
  const y = new Consumer(yNc, "q.orders.y", { ackMode: nakDead });
  await Promise.all([xNc.flush(), yNc.flush()]);
  const claimsOf = async (br) => metricValue(await br.metrics(), "fluxon_claims", { channel: "orders" }) || 0;
  await waitFor(async () => (await claimsOf(L)) >= 2 && (await claimsOf(R)) >= 2, { timeout: 10_000, what: "claims for x and y on each bridge" });

  const pubNc = await natsConnect(ctx, st.nats.url, "pub");
  // Acked work parked in the dead-letter channel, which nobody publishes to or reads during the
  // restarts: it must survive them too.
  const DEAD = 50;
  const deadMsgs = Array.from({ length: DEAD }, (_, i) => makeMsg("dead", i, "orders.dead"));
  const dres = await publishAll(pubNc, deadMsgs, { concurrency: 16, timeout: 10_000 });
  assert.equal(dres.acked.size, DEAD, `dead-letter candidates acked: ${dres.acked.size}`);
  await waitBacklog(pubNc, "orders-dlq", DEAD, 20_000);
  const dlqId = await mpmcId(st.etcd, st.prefix, "orders-dlq");

  const stream = publishStream(pubNc, (n) => makeMsg("roll", n, `orders.r${n % 4}`), { concurrency: 32, timeout: 5000 });
  const STEP = 400;
  // ttl_seconds (the killed member's leases) + ack_wait (redelivery) + 5 s of slack
  const UNDER_LOAD_MS = 2000 + 3000 + 5000;
  const progress = async (what) => {
    const from = stream.acked.size;
    await waitFor(() => stream.acked.size >= from + STEP, { timeout: 30_000, interval: 50, what: () => `${STEP} more acks ${what} (${stream.acked.size - from})` });
  };
  const steps = [
    ["SIGTERM", L], ["SIGTERM", R], ["SIGKILL", L], ["SIGKILL", R],
  ];
  const events = []; // {how, bridge, at (signal sent), spawn (restart spawned)}
  await progress("before the first restart");
  for (const [how, br] of steps) {
    const t0 = Date.now();
    const ev = { how, bridge: br.name, at: t0 };
    events.push(ev);
    const ex = how === "SIGTERM" ? await br.stop() : await br.kill9();
    ev.spawn = Date.now();
    if (how === "SIGTERM") assert.equal(ex.code, 0, `${br.name} exit after SIGTERM: ${JSON.stringify(ex)}`);
    await br.start();
    ctx.log(`${how} ${br.name} at ${stream.acked.size} acks; healthy again after ${Date.now() - t0} ms`);
    await progress(`after the ${how} restart of ${br.name}`);
  }
  // While the load continues (claims never idle), everything acked so far must be delivered:
  // the backlog of the killed bridges' claims may not wait for the load to stop.
  const snap = [...stream.acked.keys()];
  const tSnap = Date.now();
  const haveNow = (id) => x.counts.has(id) || y.counts.has(id);
  try {
    await waitFor(() => (x.check(), y.check(), snap.every(haveNow)), { timeout: UNDER_LOAD_MS, interval: 100, what: () => `the ${snap.length} messages acked so far delivered while the load continues (have ${snap.filter(haveNow).length}, ${stream.acked.size} acked now)` });
    ctx.log(`all ${snap.length} acked so far delivered under load after ${Date.now() - tSnap} ms`);
  } catch (e) {
    const missing = snap.filter((id) => !haveNow(id));
    await stream.stop();
    throw new Error(`${e.message}; missing e.g. ${missing.slice(0, 10).join(" ")}`);
  }
  const res = await stream.stop();
  const ackedIds = [...res.acked.keys()];
  ctx.log(`load stopped: ${res.published} published, ${ackedIds.length} acked, ${res.failed.size} never acked; errors retried: ${JSON.stringify([...res.errCodes])}`);

  const have = (id) => x.counts.has(id) || y.counts.has(id);
  try {
    await waitFor(() => (x.check(), y.check(), ackedIds.every(have)), { timeout: 60_000, interval: 200, what: () => `every acked message delivered (have ${ackedIds.filter(have).length}/${ackedIds.length})` });
  } finally {
    // dead-* ids are delivered max_deliver times by design: not duplicates
    const merged = new Map([...mergedCounts([x, y])].filter(([id]) => id.startsWith("roll-")));
    const dups = [...merged].filter(([, n]) => n > 1);
    const extra = dups.reduce((s, [, n]) => s + n - 1, 0);
    ctx.log(`rolling-restart report: acked ${ackedIds.length}, delivered ${ackedIds.filter(have).length} distinct (x ${x.unique}, y ${y.unique}), lost ${ackedIds.filter((id) => !have(id)).length}, duplicated ids ${dups.length} (extra deliveries ${extra})`);
    if (dups.length) ctx.log(`duplicates (first 20): ${dups.slice(0, 20).map(([id, n]) => `${id}x${n}`).join(" ")}`);
  }
  await waitBacklog(pubNc, "orders", 0, 30_000);
  assertNoConsumerErrors([x, y]);
  assertCovers(ackedIds, [...x.counts.keys(), ...y.counts.keys()], "acked during the rolling restart");
  rollingDuplicates(ctx, [x, y], res, events, { claimsPerBridge: 2, maxAckPending: DEFAULTS.max_ack_pending, concurrency: 32 });
  // the dead letters parked before the restarts are all still there
  const dNc = await natsConnect(ctx, st.nats.url, "dlq");
  const d = new Consumer(dNc, "q.orders-dlq.d");
  await dNc.flush();
  const deadIds = deadMsgs.map((m) => m.id);
  try {
    await waitFor(async () => {
      d.check();
      if (deadIds.every((id) => d.counts.has(id))) return true;
      const now = await mpmcId(st.etcd, st.prefix, "orders-dlq");
      if (now !== null && now !== dlqId) {
        const e = new Error(`the dead-letter channel's MPMC was replaced (${dlqId} -> ${now}): its dead letters are gone`);
        e.fatal = true;
        throw e;
      }
      return false;
    }, { timeout: 20_000, interval: 100, what: () => `the ${DEAD} dead letters parked before the restarts (have ${d.unique})` });
  } finally {
    ctx.log(`dead letters after the rolling restart: ${deadIds.filter((id) => d.counts.has(id)).length}/${DEAD}`);
  }
  const [e1, e2] = await Promise.all([L.stop(), R.stop()]);
  assert.equal(e1.code, 0, `L exit ${JSON.stringify(e1)}`);
  assert.equal(e2.code, 0, `R exit ${JSON.stringify(e2)}`);
}, { timeout: 150_000 });

/** The bridge that made a delivery: the token after "FLUXON" in its ack reply subject. */
function originOf(rec) {
  const t = rec.reply.split(".");
  const k = t.indexOf("FLUXON", 2);
  return k >= 0 ? t[k + 1] : "?";
}

/**
 * Duplicates of the rolling restart, each explained by what was in flight at a SIGKILL (none by
 * a SIGTERM: the drain answers every publish and waits for the acks of its deliveries, so a
 * graceful restart adds no duplicate). A roll-* id delivered more than once is either
 *  - stored twice (distinct Fluxon-Id): a publish whose PubAck the killed bridge never sent was
 *    retried; the id needed more than one attempt; at most the publishes in flight
 *    (concurrency) per SIGKILL;
 *  - one stored message delivered again: its first delivery came from bridge B (ack reply
 *    subject) before a SIGKILL of B, whose claims had not committed it; the claim that adopts
 *    the sub-MPSC reads from the committed offset. At most the killed bridge's unacked windows
 *    (max_ack_pending per claim, claimsPerBridge claims) plus the acks still on their way to a
 *    commit (no configured bound: one commit round trip's worth; allowance: one more window),
 *    per SIGKILL. The per-message checks are the exact ones.
 * Anything else (a redelivery after a SIGTERM, or with no restart at all) fails the test.
 */
function rollingDuplicates(ctx, consumers, res, events, { claimsPerBridge, maxAckPending, concurrency }) {
  const byFid = new Map();
  const fidsOf = new Map();
  for (const c of consumers) {
    for (const r of c.records) {
      if (!r.id || !r.id.startsWith("roll-")) continue; // dead-* are delivered max_deliver times by design
      const fid = r.headers ? r.headers.get("Fluxon-Id") : "";
      if (!byFid.has(fid)) byFid.set(fid, []);
      byFid.get(fid).push(r);
      if (!fidsOf.has(r.id)) fidsOf.set(r.id, new Set());
      fidsOf.get(r.id).add(fid);
    }
  }
  const kills = events.filter((e) => e.how === "SIGKILL");
  const storedTwice = [...fidsOf].filter(([, f]) => f.size > 1).map(([id]) => id);
  const badStored = storedTwice.filter((id) => !((res.attempts.get(id) || 0) > 1));
  const redelivered = [...byFid].filter(([, rs]) => rs.length > 1).map(([fid, rs]) => {
    const first = rs.reduce((a, b) => (b.at < a.at ? b : a));
    const from = originOf(first);
    // the SIGKILL of that bridge that followed the first delivery (before its restart spawned)
    const kill = kills.find((k) => k.bridge === from && first.at < k.spawn && !events.some((e) => e.bridge === from && e.at > first.at && e.at < k.at));
    return { fid, id: first.id, from, at: first.at, kill };
  });
  const bad = redelivered.filter((d) => !d.kill);
  const perKill = kills.map((k) => redelivered.filter((d) => d.kill === k).length);
  const windowBound = 2 * maxAckPending * claimsPerBridge;
  const publishBound = concurrency * kills.length;
  ctx.log(`duplicates: ${storedTwice.length} ids stored twice (bound ${publishBound}: ${concurrency} publishes in flight x ${kills.length} SIGKILLs), ` +
    `${redelivered.length} stored messages redelivered: ${kills.map((k, i) => `${perKill[i]} from SIGKILL ${k.bridge}`).join(", ")} ` +
    `(bound per SIGKILL: 2 x max_ack_pending ${maxAckPending} x ${claimsPerBridge} claims = ${windowBound}), ${bad.length} unexplained`);
  const show = (d) => `${d.id} (${d.fid}) first from ${d.from} at ${events.length ? `${d.at - events[0].at} ms after the first restart` : d.at}`;
  assert.equal(badStored.length, 0, `ids stored twice without a publish retry: ${badStored.slice(0, 5).join(", ")}`);
  assert.equal(bad.length, 0, `redeliveries not explained by a SIGKILL (a graceful restart must add none): ${bad.slice(0, 5).map(show).join("; ")}`);
  assert.ok(storedTwice.length <= publishBound, `${storedTwice.length} ids stored twice > ${publishBound}`);
  perKill.forEach((n, i) => assert.ok(n <= windowBound, `${n} redelivered after SIGKILL ${kills[i].bridge} > in-flight window ${windowBound}`));
}
