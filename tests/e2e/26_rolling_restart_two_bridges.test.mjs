// e2e_rolling_restart_two_bridges (issue 9): two bridges, an acked publish stream that never
// stops (each publish retried until acked), subscribers on two names (each bridge claims for
// both). Each bridge is restarted in turn while the load continues: first SIGTERM + start (L, then
// R), then SIGKILL + start (L, then R). While the load still runs, every message acked so far is
// delivered within ttl_seconds + ack_wait + 5 s (a killed bridge's backlog does not wait for the
// load to stop); after the load, 0 acked messages lost; duplicates are counted and reported.
// Acked messages dead-lettered before the restarts (parked in orders-dlq, which nobody publishes to
// or reads meanwhile) are all delivered to a dead-letter subscriber afterwards.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, metricValue, mpmcId } from "./lib/stack.mjs";
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
  await progress("before the first restart");
  for (const [how, br] of steps) {
    const t0 = Date.now();
    const ex = how === "SIGTERM" ? await br.stop() : await br.kill9();
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
