// e2e_departed_claim_backlog_moves: two subscriber names, q.orders.a (acks nothing, so
// its claims hold a backlog: max_ack_pending in flight plus what waits in its sub-MPSCs) and
// q.orders.b (acks everything), two bridges (each bridge claims for both names).
//  A. graceful: a unsubscribes. The backlog of a's claims starts reaching b within
//     release_after + 1 s: the first delivery at b of a message that a had received.
//  B. a subscribes again, takes a new backlog; then bridge L is killed with SIGKILL while a
//     leaves. The backlog of a's claim on L reaches b within ttl_seconds + 1 s of the kill; that
//     of a's claim on the surviving bridge R within release_after + 1 s.
// Finally every acked message reaches b. Times are measured in this process from the departure
// (after the unsubscribe was flushed to the server) or the SIGKILL to the arrival at b; no margin
// is added to the targets.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, metricValue, SLOW } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll } from "./lib/client.mjs";
import { assert, assertCovers, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_departed_claim_backlog_moves", async (ctx) => {
  const TTL_S = 2;
  const RELEASE_MS = 1000;
  const PENDING = 10;
  const defaults = { ttl_seconds: TTL_S, release_after: "1s", interest_poll: "200ms", ack_wait: "30s", max_ack_pending: PENDING };
  const st = await startStack(ctx);
  const L = st.bridge({ name: "L", defaults });
  const R = st.bridge({ name: "R", defaults });
  await Promise.all([L.start(), R.start()]);
  const nc = await natsConnect(ctx, st.nats.url, "pub");
  const bNc = await natsConnect(ctx, st.nats.url, "b");
  const b = new Consumer(bNc, "q.orders.b");
  await bNc.flush();
  const fromBridge = (rec) => rec.reply.split(".")[3];
  const acked = [];
  const publish = async (tag, n) => {
    const msgs = Array.from({ length: n }, (_, i) => makeMsg(tag, i, `orders.${tag}${i % 2}`));
    const res = await publishAll(nc, msgs, { concurrency: 64, timeout: 10_000 });
    assert.equal(res.failed.size, 0, `${tag}: not acked ${res.failed.size}; first: ${JSON.stringify([...res.failed.values()][0])}`);
    acked.push(...res.acked.keys());
  };
  // a subscribes and holds PENDING unacked deliveries from each bridge's claim
  const subscribeA = async (tag) => {
    const aNc = await natsConnect(ctx, st.nats.url, `a-${tag}`);
    const a = new Consumer(aNc, "q.orders.a", { ackMode: "none" });
    await aNc.flush();
    return { a, aNc };
  };
  const held = (a, bridge) => a.records.filter((r) => fromBridge(r) === bridge).map((r) => r.id);
  // First arrival at b, after t0, of any id in `ids`: ms after t0, or null.
  const firstAt = (ids, t0) => {
    const s = new Set(ids);
    const hit = b.records.find((r) => r.at >= t0 && s.has(r.id));
    return hit ? hit.at - t0 : null;
  };
  const waitArrival = async (ids, t0, bound, what) => {
    try {
      await waitFor(() => (b.check(), firstAt(ids, t0) !== null), { timeout: bound + 5000, interval: 20, what: `${what}: a message of the departed backlog at b` });
    } catch (e) {
      throw new Error(`${e.message}; target ${bound} ms; b received ${b.records.filter((r) => r.at >= t0).length} deliveries since, none of the ${ids.length} held by the departed claim`);
    }
    const ms = firstAt(ids, t0);
    ctx.log(`${what}: first departed-backlog message at b after ${ms} ms (target ${bound} ms)`);
    return ms;
  };

  // ---- A. graceful departure ----
  // each bridge claims for every name it sees: wait for both names' claims on both bridges
  const claimsOf = async (br) => metricValue(await br.metrics(), "fluxon_claims", { channel: "orders" }) || 0;
  // gauges compared with an earlier reading (more or fewer claims than then), on both bridges
  const gauges = async () => [await claimsOf(L), await claimsOf(R)];
  const waitGauges = async (cmp, ref, what) => {
    let g = [];
    await waitFor(async () => {
      g = await gauges();
      return g.every((v, i) => cmp(v, ref[i]));
    }, { timeout: 10_000, what: () => `${what} (claims L ${g[0]}, R ${g[1]}; before ${ref})` });
    return g;
  };
  const g0 = await waitGauges((v) => v >= 1, [], "b's claim on each bridge");
  let { a, aNc } = await subscribeA("1");
  const g1 = await waitGauges((v, r) => v > r, g0, "a's claim on each bridge too");
  await publish("A", 400);
  await waitFor(() => held(a, "L").length >= PENDING && held(a, "R").length >= PENDING, { timeout: 15_000, what: () => `a holds ${PENDING} unacked from each bridge (L ${held(a, "L").length}, R ${held(a, "R").length})` });
  const heldA = a.records.map((r) => r.id);
  ctx.log(`A: a holds ${heldA.length} unacked (L ${held(a, "L").length}, R ${held(a, "R").length}); b has ${b.unique}`);
  await a.unsubscribe();
  const tLeave = Date.now();
  const msA = await waitArrival(heldA, tLeave, RELEASE_MS + 1000, "A (graceful)");
  await aNc.close();

  // ---- B. the bridge holding a's claim is killed ----
  const g2 = await waitGauges((v, r) => v < r, g1, "a's claims released on both bridges");
  ({ a, aNc } = await subscribeA("2"));
  await waitGauges((v, r) => v > r, g2, "a's new claim on each bridge");
  await publish("B", 400);
  await waitFor(() => held(a, "L").length >= PENDING && held(a, "R").length >= PENDING, { timeout: 15_000, what: () => `a (again) holds ${PENDING} unacked from each bridge (L ${held(a, "L").length}, R ${held(a, "R").length})` });
  const heldL = held(a, "L");
  const heldR = held(a, "R");
  ctx.log(`B: a holds ${heldL.length} from L, ${heldR.length} from R; SIGKILL to L while a leaves`);
  const tKill = Date.now();
  const killing = L.kill9();
  await a.unsubscribe();
  await killing;
  const [msL, msR] = await Promise.all([
    waitArrival(heldL, tKill, TTL_S * 1000 + 1000, "B (claim on the killed bridge)"),
    waitArrival(heldR, tKill, RELEASE_MS + 1000, "B (claim on the surviving bridge)"),
  ]);
  await aNc.close();

  // Nothing acked is lost: all of it reaches b.
  const have = (id) => b.counts.has(id);
  await waitFor(() => (b.check(), acked.every(have)), { timeout: 30_000, interval: 100, what: () => `every acked message at b (have ${acked.filter(have).length}/${acked.length})` });
  assertNoConsumerErrors([b]);
  assertCovers(acked, [...b.counts.keys()], "acked messages at b");
  ctx.log(`departed-claim report: graceful ${msA} ms (target ${RELEASE_MS + 1000}), killed bridge ${msL} ms (target ${TTL_S * 1000 + 1000}), surviving bridge ${msR} ms (target ${RELEASE_MS + 1000}); b: ${b.unique} distinct, ${b.duplicates().length} duplicated ids`);
  // (sanitizer builds, SLOW > 1, check correctness: there the bounds are stretched like every wait)
  assert.ok(msA <= (RELEASE_MS + 1000) * SLOW, `graceful: the departed backlog reached b after ${msA} ms > release_after + 1 s`);
  assert.ok(msL <= (TTL_S * 1000 + 1000) * SLOW, `kill -9: the killed claim's backlog reached b after ${msL} ms > ttl_seconds + 1 s`);
  assert.ok(msR <= (RELEASE_MS + 1000) * SLOW, `kill -9: the surviving bridge's departed backlog reached b after ${msR} ms > release_after + 1 s`);
  const ex = await R.stop();
  assert.equal(ex.code, 0, `R exit ${JSON.stringify(ex)}`);
}, { timeout: 120_000 });
