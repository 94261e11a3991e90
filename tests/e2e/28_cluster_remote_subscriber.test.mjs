// e2e_cluster_remote_subscriber: three nats-servers in one cluster (routes), one etcd,
// the bridge beside server A (client, monitor and leafnode connections to A only). A subscriber
// connected to server B, a publisher connected to server C: every acked publish is captured once
// and delivered to the subscriber on B, and its acks reach the bridge (the channel's backlog
// returns to 0). nats-server 2.9's /subsz on A does not list B's subscription; the bridge sees it
// in A's /routez.
import { test } from "./lib/runner.mjs";
import { Etcd, startNatsCluster, waitFor, metricValue } from "./lib/stack.mjs";
import { Bridge } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert, assertCovers, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_cluster_remote_subscriber", async (ctx) => {
  const etcd = new Etcd(ctx);
  const [[A, B, C]] = await Promise.all([startNatsCluster(ctx, 3), etcd.start()]);
  const br = new Bridge(ctx, { name: "A", nats: A, etcd, prefix: `/fxe2e-${ctx.name}` });
  await br.start();
  const subNc = await natsConnect(ctx, B.url, "sub-on-B");
  const sub = new Consumer(subNc, "q.orders.remote");
  await subNc.flush();
  let claims = 0;
  await waitFor(async () => (claims = metricValue(await br.metrics(), "fluxon_claims", { channel: "orders" }) || 0) >= 1, { timeout: 10_000, what: () => `the bridge on A claims for the subscriber on B (claims ${claims})` });
  const pubNc = await natsConnect(ctx, C.url, "pub-on-C");
  const N = 300;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("R", i, `orders.r${i % 3}`));
  const res = await publishAll(pubNc, msgs, { concurrency: 32, timeout: 10_000 });
  assert.equal(res.failed.size, 0, `publishes on C not acked: ${res.failed.size}; first: ${JSON.stringify([...res.failed.values()][0])}`);
  const acked = [...res.acked.keys()];
  await waitFor(() => (sub.check(), acked.every((id) => sub.counts.has(id))), { timeout: 20_000, interval: 100, what: () => `every acked message at the subscriber on B (have ${acked.filter((id) => sub.counts.has(id)).length}/${acked.length})` });
  assertNoConsumerErrors([sub]);
  assertCovers(acked, [...sub.counts.keys()], "acked messages at B");
  const adminNc = await natsConnect(ctx, A.url, "admin");
  await waitBacklog(adminNc, "orders", 0, 15_000); // every delivery acked from B, committed
  const m = await br.metrics();
  const captured = metricValue(m, "fluxon_captured_total", { channel: "orders" });
  ctx.log(`published on C ${N}, acked ${acked.length}, delivered on B ${sub.unique} distinct (${sub.duplicates().length} duplicated), captured ${captured}, lost ${acked.filter((id) => !sub.counts.has(id)).length}`);
  assert.equal(captured, N, `captured ${captured} times for ${N} publishes (captured once each expected)`);
  const ex = await br.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
}, { timeout: 90_000 });
