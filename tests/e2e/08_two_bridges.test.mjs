// e2e_two_bridges: two bridges beside one nats-server and one etcd. Each publish is captured once
// (queue group: the captured counters of both bridges add up to the number published, and both
// captured some), both bridges hold claims, and in this graceful run no message is lost or
// duplicated across the two subscribers.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, metricValue, readyKeys } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog, waitUniqueAcross } from "./lib/client.mjs";
import { assert, assertSameSet, assertNoDuplicates, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_two_bridges", async (ctx) => {
  const st = await startStack(ctx);
  const b1 = st.bridge({ name: "left" });
  const b2 = st.bridge({ name: "right" });
  await Promise.all([b1.start(), b2.start()]);
  const nc = await natsConnect(ctx, st.nats.url, "pub");
  const ncX = await natsConnect(ctx, st.nats.url, "x");
  const ncY = await natsConnect(ctx, st.nats.url, "y");
  const x = new Consumer(ncX, "q.orders.x");
  const y = new Consumer(ncY, "q.orders.y");
  await Promise.all([ncX.flush(), ncY.flush()]);
  // Both bridges take claims for the subscribers they see.
  const claimsOf = async (b) => metricValue(await b.metrics(), "fluxon_claims", { channel: "orders" }) || 0;
  await waitFor(async () => (await claimsOf(b1)) >= 1 && (await claimsOf(b2)) >= 1,
    { timeout: 15_000, what: "a claim on each bridge" });
  const rk = await readyKeys(st.etcd, st.prefix, "orders");
  ctx.log(`claims: left ${await claimsOf(b1)}, right ${await claimsOf(b2)}; ready keys ${rk.length}`);
  assert.ok(rk.length >= 2, `at least two claimed sub-MPSCs in etcd (${rk.length})`);

  const N = 4000;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("two", i, i % 2 ? "orders.left.x" : "orders.right.y"));
  const res = await publishAll(nc, msgs, { concurrency: 256, timeout: 20_000 });
  assert.equal(res.failed.size, 0, `failed: ${JSON.stringify([...res.failed.values()][0])}`);
  assert.ok([...res.acked.values()].every((a) => a.stream === "orders"), "PubAck stream");
  // seqs identify messages across both bridges' producers and every sub-MPSC
  assert.equal(new Set([...res.acked.values()].map((a) => a.seq)).size, N, "PubAck seqs distinct across bridges");
  await waitUniqueAcross([x, y], N, 90_000);
  await waitBacklog(nc, "orders", 0, 20_000);

  const cap = async (b) => metricValue(await b.metrics(), "fluxon_captured_total", { channel: "orders" }) || 0;
  const c1 = await cap(b1);
  const c2 = await cap(b2);
  ctx.log(`captured: left ${c1}, right ${c2}; delivered x ${x.unique}, y ${y.unique}`);
  assert.equal(c1 + c2, N, "each publish captured exactly once across the two bridges");
  assert.ok(c1 > 0 && c2 > 0, "the queue group spread captures over both bridges");
  assertNoConsumerErrors([x, y]);
  assertSameSet(msgs.map((m) => m.id), [...x.counts.keys(), ...y.counts.keys()], "x+y");
  assertNoDuplicates([x, y]);
  for (const r of [...x.records, ...y.records]) assert.equal(Number(r.seq), res.acked.get(r.id).seq, `Fluxon-Seq of ${r.id}`);
  assert.ok(x.unique > 0 && y.unique > 0, "both subscribers got a share");
  // Acks go back to the bridge that delivered (the bridge token of the ack subject).
  const bridgesSeen = new Set([...x.records, ...y.records].map((r) => r.reply.split(".")[3]));
  ctx.log(`deliveries came from bridges: ${[...bridgesSeen].join(",")}`);
  for (const name of bridgesSeen) assert.ok(["left", "right"].includes(name), `ack subject bridge token ${name}`);

  const [e1, e2] = await Promise.all([b1.stop(), b2.stop()]);
  assert.equal(e1.code, 0, `left exit ${JSON.stringify(e1)}`);
  assert.equal(e2.code, 0, `right exit ${JSON.stringify(e2)}`);
  assert.equal((await readyKeys(st.etcd, st.prefix, "orders")).length, 0, "claims released on shutdown");
  b1.assertLogClean();
  b2.assertLogClean();
}, { timeout: 180_000 });
