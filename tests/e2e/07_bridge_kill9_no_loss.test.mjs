// e2e_bridge_kill9_no_loss: 5,000 acked publishes in flight (256 at a time, each retried until it
// is acked), the bridge is killed with SIGKILL part-way and started again; every acked publish is
// delivered at least once to the subscriber; duplicates are counted and reported.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert, assertCovers, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_bridge_kill9_no_loss", async (ctx) => {
  const st = await startStack(ctx);
  const bridge = st.bridge({ name: "k9", defaults: { ttl_seconds: 3, ack_wait: "5s" } });
  await bridge.start();
  const pubNc = await natsConnect(ctx, st.nats.url, "pub");
  const subNc = await natsConnect(ctx, st.nats.url, "sub");
  const c = new Consumer(subNc, "q.orders.k");
  await subNc.flush();

  const N = 5000;
  const KILL_AT = 1500;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("k9", i, `orders.k${i % 4}`));
  let killed = null;
  let restarted = null;
  const pub = publishAll(pubNc, msgs, {
    concurrency: 256,
    retry: true,
    deadline: 150_000,
    timeout: 5000,
    onAck: (m, ack, count) => {
      if (count === KILL_AT && !killed) {
        killed = (async () => {
          const ex = await bridge.kill9();
          ctx.log(`SIGKILL at ${count} acks (exit ${JSON.stringify(ex)}); delivered so far ${c.unique}`);
          restarted = bridge.start().then(() => ctx.log("bridge restarted and healthy"));
          await restarted;
        })();
      }
    },
  });
  const res = await pub;
  assert.ok(killed, "the bridge was killed during the stream");
  await killed;
  assert.equal(res.failed.size, 0, `publishes never acked: ${res.failed.size}; first: ${JSON.stringify([...res.failed.values()][0])}`);
  assert.equal(res.acked.size, N);
  const retried = [...res.attempts.values()].filter((a) => a > 1).length;
  ctx.log(`all ${N} acked; ${retried} needed a retry`);

  const ackedIds = [...res.acked.keys()];
  try {
    await waitFor(() => ackedIds.every((id) => c.counts.has(id)), { timeout: 90_000, interval: 200, what: () => `every acked publish delivered (have ${c.unique}/${N})` });
  } finally {
    const dups = c.duplicates();
    const extra = dups.reduce((s, [, n]) => s + n - 1, 0);
    ctx.log(`kill9 report: published ${N}, acked ${res.acked.size}, retried ${retried}, deliveries ${c.records.length}, distinct ${c.unique}, duplicated ids ${dups.length} (extra deliveries ${extra})`);
    if (dups.length) ctx.log(`duplicates (first 20): ${dups.slice(0, 20).map(([id, n]) => `${id}x${n}`).join(" ")}`);
  }
  await waitBacklog(pubNc, "orders", 0, 30_000);
  assertNoConsumerErrors([c]);
  assertCovers(ackedIds, [...c.counts.keys()], "acked publishes after kill -9");
  // Redeliveries after the crash are marked as such or carry the same data.
  for (const r of c.records) assert.equal(r.xid, r.id);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
}, { timeout: 240_000 });
