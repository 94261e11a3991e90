// e2e_burst_spreads_in_flight: 16 subscriber names (16 claims, so 16 ready
// sub-MPSCs). A burst of 512 acked publishes at concurrency 256 reaches every name: a capture
// batch takes at most queued / ready messages (>= 8), so the burst spreads over the ready
// sub-MPSCs instead of landing in one or two; and more than one batch was stored at once
// (fluxon_put_batches_in_flight_peak >= 2, each batch to its own sub-MPSC). Every acked message
// is delivered.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, metricValue } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll } from "./lib/client.mjs";
import { assert, assertCovers, assertNoConsumerErrors } from "./lib/check.mjs";

const NAMES = 16;
const MSGS = 512;

test("e2e_burst_spreads_in_flight", async (ctx) => {
  const st = await startStack(ctx);
  const B = st.bridge({ name: "B", defaults: { ttl_seconds: 30, interest_poll: "200ms" } });
  await B.start();
  const subNc = await natsConnect(ctx, st.nats.url, "subs");
  const consumers = [];
  for (let i = 0; i < NAMES; i++) consumers.push(new Consumer(subNc, `q.orders.s${i}`));
  await subNc.flush();
  let c = 0;
  const claims = async () => metricValue(await B.metrics(), "fluxon_claims", { channel: "orders" }) || 0;
  await waitFor(async () => (c = await claims()) >= NAMES, { timeout: 60_000, interval: 200, what: () => `${NAMES} claims (have ${c})` });

  const pubNc = await natsConnect(ctx, st.nats.url, "pub");
  // the bridge learns the ready sub-MPSCs by watch: one acked publish after the claims
  const warm = await publishAll(pubNc, [makeMsg("W", 0, "orders.w")], { concurrency: 1, timeout: 10_000 });
  assert.equal(warm.acked.size, 1);
  const msgs = Array.from({ length: MSGS }, (_, i) => makeMsg("S", i, `orders.k${i % 16}`));
  const res = await publishAll(pubNc, msgs, { concurrency: 256, timeout: 20_000 });
  assert.equal(res.failed.size, 0, `not acked ${res.failed.size}; first: ${JSON.stringify([...res.failed.values()][0])}`);
  const acked = [...warm.acked.keys(), ...res.acked.keys()];
  const distinct = () => {
    const s = new Set();
    for (const k of consumers) for (const id of k.counts.keys()) s.add(id);
    return s;
  };
  let have = 0;
  await waitFor(() => (consumers.forEach((k) => k.check()), (have = distinct().size) >= acked.length), { timeout: 60_000, interval: 200, what: () => `every acked message delivered (have ${have}/${acked.length})` });
  assertNoConsumerErrors(consumers);
  assertCovers(acked, [...distinct()], "acked messages across the names");
  const per = consumers.map((k) => k.unique);
  const m = await B.metrics();
  const peak = metricValue(m, "fluxon_put_batches_in_flight_peak", { channel: "orders" });
  ctx.log(`per name: ${per.join(" ")}; names with none ${per.filter((n) => n === 0).length}; batches in flight at once (peak) ${peak}`);
  assert.ok(per.every((n) => n > 0), `${per.filter((n) => n === 0).length} of ${NAMES} names received nothing of the burst`);
  assert.ok(peak >= 2, `batches stored at once peaked at ${peak} (want >= 2 with ${NAMES} ready sub-MPSCs)`);
  const ex = await B.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
}, { timeout: 150_000 });
