// bench_cluster_two_bridges_vs_one (BENCHMARKS.md): end-to-end throughput on the
// cluster shape (three routed nats-servers, one etcd) with one bridge (beside A) and with two
// (beside A and B). Subscriber and publisher on C; N acked publishes (concurrency 256, each
// retried until acked); msgs/s from the first publish to the last delivery. Asserts nothing is
// lost; prints one row per shape.
import { test } from "../lib/runner.mjs";
import { Etcd, Bridge, startNatsCluster, waitFor, metricValue } from "../lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll } from "../lib/client.mjs";
import { assert, assertCovers } from "../lib/check.mjs";

const N = Number(process.env.FXBENCH_MSGS || 20_000);

test("bench_cluster_two_bridges_vs_one", async (ctx) => {
  const rows = [];
  for (const bridges of [1, 2]) {
    const etcd = new Etcd(ctx, `etcd-${bridges}`);
    const [[A, B, C]] = await Promise.all([startNatsCluster(ctx, 3, `c${bridges}`), etcd.start()]);
    const prefix = `/fxbench-${bridges}`;
    const defaults = { ttl_seconds: 5, ack_wait: "30s", max_ack_pending: 1000 };
    const brs = [new Bridge(ctx, { name: `L${bridges}`, nats: A, etcd, prefix, defaults })];
    if (bridges === 2) brs.push(new Bridge(ctx, { name: `R${bridges}`, nats: B, etcd, prefix, defaults }));
    await Promise.all(brs.map((b) => b.start()));
    const subNc = await natsConnect(ctx, C.url, "sub");
    const sub = new Consumer(subNc, "q.orders.bench");
    await subNc.flush();
    await waitFor(async () => {
      for (const b of brs) if (!((metricValue(await b.metrics(), "fluxon_claims", { channel: "orders" }) || 0) >= 1)) return false;
      return true;
    }, { timeout: 10_000, what: "every bridge claims for the subscriber" });
    const pubNc = await natsConnect(ctx, C.url, "pub");
    const msgs = Array.from({ length: N }, (_, i) => makeMsg(`b${bridges}`, i, `orders.b${i % 8}`));
    const t0 = Date.now();
    const res = await publishAll(pubNc, msgs, { concurrency: 256, retry: true, deadline: 120_000, timeout: 10_000 });
    const tAck = Date.now();
    const acked = [...res.acked.keys()];
    await waitFor(() => acked.every((id) => sub.counts.has(id)), { timeout: 60_000, interval: 50, what: () => `all delivered (${sub.unique}/${acked.length})` });
    const tAll = Date.now();
    assert.equal(res.failed.size, 0, "every publish acked");
    assertCovers(acked, [...sub.counts.keys()], "acked at the subscriber");
    rows.push({ bridges, n: N, ackS: (tAck - t0) / 1000, allS: (tAll - t0) / 1000, rate: Math.round(N / ((tAll - t0) / 1000)), dups: sub.duplicates().length, lost: acked.filter((id) => !sub.counts.has(id)).length });
    for (const b of brs) await b.stop();
    for (const s of [A, B, C]) await s.stop();
    await etcd.stop();
    await subNc.close().catch(() => {});
    await pubNc.close().catch(() => {});
  }
  ctx.log("| bridges | acked publishes | all acked after s | all delivered after s | end-to-end msgs/s | duplicated | lost |");
  ctx.log("|---|---|---|---|---|---|---|");
  for (const r of rows) ctx.log(`| ${r.bridges} | ${r.n} | ${r.ackS.toFixed(1)} | ${r.allS.toFixed(1)} | ${r.rate} | ${r.dups} | ${r.lost} |`);
}, { timeout: 400_000 });
