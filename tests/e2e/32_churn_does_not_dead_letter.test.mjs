// e2e_churn_does_not_dead_letter: a delivery counts as an attempt only when a
// subscriber could have received it. Two bridges (leaf path: no no-responders status), max_deliver
// 5, release_after 1s; paced acked publishes while subscriber names join and leave every
// 200-500 ms (each name acks everything it receives and leaves with a drain, so every message the
// server routed to it is acked). Short-lived claims must neither adopt stranded backlog once their
// subscriber is gone nor count pushes nobody could receive: 0 messages reach orders-dlq, and every
// acked message is delivered (to a churning name or to the final steady subscriber).
import { setTimeout as delay } from "node:timers/promises";
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, SLOW } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_churn_does_not_dead_letter", async (ctx) => {
  const N = Number(process.env.FXE2E_CHURN_MSGS || 30_000);
  const RATE = 1000; // publishes per second: the churn runs over the whole stream (~N / RATE s)
  // interest_poll: the product's default (1 s), as a new user runs it
  const defaults = { max_deliver: 5, release_after: "1s", interest_poll: "1s", ack_wait: "30s" };
  const st = await startStack(ctx);
  const L = st.bridge({ name: "L", defaults });
  const R = st.bridge({ name: "R", defaults });
  await Promise.all([L.start(), R.start()]);
  const ncP = await natsConnect(ctx, st.nats.url, "pub");
  const ncD = await natsConnect(ctx, st.nats.url, "dlq");
  const dlq = new Consumer(ncD, "q.orders-dlq.d");
  await ncD.flush();
  const ncC = await natsConnect(ctx, st.nats.url, "churn");

  // seeded schedule (printed, so a failing run can be replayed with FXE2E_CHURN_SEED)
  const seed = Number(process.env.FXE2E_CHURN_SEED || Date.now() % 1_000_000);
  let rs = seed >>> 0 || 1;
  const rnd = () => ((rs = (Math.imul(rs, 1103515245) + 12345) >>> 0) >>> 8) / (1 << 24);
  ctx.log(`seed ${seed}, ${N} messages at ${RATE}/s`);

  // LANES names at a time, each living 200-500 ms, then leaving with a drain (what the server
  // routed to it is processed and acked), replaced at once by a new name
  const LANES = 3;
  const consumers = [];
  let churning = true;
  let joins = 0;
  const lane = async () => {
    while (churning) {
      const c = new Consumer(ncC, `q.orders.n${joins++}`);
      consumers.push(c);
      await delay(200 + Math.floor(rnd() * 300));
      await c.sub.drain();
    }
  };
  const churn = Promise.all(Array.from({ length: LANES }, lane));

  const acked = new Set();
  const t0 = Date.now();
  const CHUNK = 100;
  for (let i = 0; i < N; i += CHUNK) {
    const msgs = [];
    for (let k = i; k < Math.min(N, i + CHUNK); k++) msgs.push(makeMsg("churn", k, `orders.c${k % 4}`));
    const res = await publishAll(ncP, msgs, { concurrency: CHUNK, retry: true, deadline: 30_000, timeout: 10_000 });
    assert.equal(res.failed.size, 0, `not acked: ${res.failed.size}; first: ${JSON.stringify([...res.failed.values()][0])}`);
    for (const id of res.acked.keys()) acked.add(id);
    const ahead = t0 + ((i + CHUNK) * 1000) / RATE - Date.now();
    if (ahead > 0) await delay(ahead); // pacing of the stream, not a synchronisation sleep
  }
  churning = false;
  await churn;
  ctx.log(`${acked.size} acked in ${((Date.now() - t0) / 1000).toFixed(1)} s; ${joins} names joined and left; dead letters so far ${dlq.records.length}`);

  // a steady subscriber takes what is left
  const ncF = await natsConnect(ctx, st.nats.url, "final");
  const fin = new Consumer(ncF, "q.orders.final");
  consumers.push(fin);
  await ncF.flush();
  const delivered = () => {
    const s = new Set();
    for (const c of consumers) for (const id of c.counts.keys()) s.add(id);
    return s;
  };
  const deadIds = () => new Set(dlq.records.map((r) => r.id));
  try {
    await waitFor(() => {
      const d = delivered();
      const dead = deadIds();
      let missing = 0;
      for (const id of acked) if (!d.has(id) && !dead.has(id)) missing++;
      return missing === 0;
    }, { timeout: 60_000 * SLOW, interval: 200, what: "every acked message delivered or dead-lettered" });
  } finally {
    const d = delivered();
    const lost = [...acked].filter((id) => !d.has(id) && !deadIds().has(id));
    let dups = 0;
    for (const c of consumers) for (const [, n] of c.counts) if (n > 1) dups += n - 1;
    const hist = {};
    for (const c of consumers) for (const r of c.records) hist[r.delivered] = (hist[r.delivered] || 0) + 1;
    ctx.log(`report: acked ${acked.size}, delivered ${d.size}, dead-lettered ${dlq.records.length}, lost ${lost.length}, redeliveries ${dups} (within one name); deliveries by Fluxon-Delivered ${JSON.stringify(hist)}`);
  }
  await waitBacklog(ncP, "orders", 0, 30_000);
  await waitBacklog(ncP, "orders-dlq", 0, 30_000);
  assertNoConsumerErrors(consumers);
  const reasons = {};
  for (const r of dlq.records) reasons[r.deadReason] = (reasons[r.deadReason] || 0) + 1;
  assert.equal(dlq.records.length, 0, `messages dead-lettered under churn: ${dlq.records.length} (${JSON.stringify(reasons)}; Fluxon-Dead-Delivered of the first: ${dlq.records[0] && dlq.records[0].headers.get("Fluxon-Dead-Delivered")})`);
  const d = delivered();
  for (const id of acked) assert.ok(d.has(id), `acked ${id} never delivered`);
  const [e1, e2] = await Promise.all([L.stop(), R.stop()]);
  assert.equal(e1.code, 0, `L exit ${JSON.stringify(e1)}`);
  assert.equal(e2.code, 0, `R exit ${JSON.stringify(e2)}`);
}, { timeout: 240_000 });
