// e2e_consumer_leaves_during_etcd_outage: ttl_seconds 90 (member leases outlive the whole
// test, so nothing may be left to expiry). A subscriber holds the claim over a backlog of 1,000
// acked messages (acking none of its deliveries) and leaves while etcd is frozen (SIGSTOP) for
// 12 s. Within 5 s of etcd coming back (SIGCONT), a new subscriber under the same name receives
// all 1,000 acked messages: the close that could not reach etcd finished when etcd returned.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, readyKeys } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitClaims } from "./lib/client.mjs";
import { assert, assertCovers, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_consumer_leaves_during_etcd_outage", async (ctx) => {
  const OUTAGE_MS = 12_000;
  const AFTER_MS = 5000;
  const st = await startStack(ctx);
  const bridge = st.bridge({
    name: "out",
    defaults: { ttl_seconds: 90, ack_wait: "30s", max_ack_pending: 10, release_after: "1s" },
  });
  await bridge.start();
  const nc = await natsConnect(ctx, st.nats.url, "pub");
  const oldNc = await natsConnect(ctx, st.nats.url, "old");
  // The first subscriber never acks: its claim keeps 10 in flight and the rest as backlog.
  const old = new Consumer(oldNc, "q.orders.w", { ackMode: "none" });
  await oldNc.flush();
  await waitClaims(nc, "orders", 1);

  const N = 1000;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("out", i, `orders.o${i % 3}`));
  const res = await publishAll(nc, msgs, { concurrency: 128, timeout: 10_000 });
  assert.equal(res.failed.size, 0, `publishes not acked: ${res.failed.size}; first: ${JSON.stringify([...res.failed.values()][0])}`);
  const ackedIds = [...res.acked.keys()];
  await old.waitUnique(10, 10_000, "10 unacked deliveries in flight to the first subscriber");
  const rk = await readyKeys(st.etcd, st.prefix, "orders");
  ctx.log(`${ackedIds.length} acked; first subscriber holds ${rk.length} claim(s) with ${old.unique} unacked deliveries`);

  // etcd freezes, the subscriber leaves during the outage.
  st.etcd.pause();
  const tStop = Date.now();
  await old.unsubscribe();
  await oldNc.close();
  // The point of the test: an outage of 12 s wall-clock time (longer than release_after and the
  // etcd call deadlines, far shorter than ttl_seconds).
  await new Promise((r) => setTimeout(r, OUTAGE_MS - (Date.now() - tStop)));
  st.etcd.resume();
  const tBack = Date.now();
  ctx.log(`etcd frozen for ${tBack - tStop} ms; subscriber left during the outage`);

  const newNc = await natsConnect(ctx, st.nats.url, "new");
  const fresh = new Consumer(newNc, "q.orders.w");
  await newNc.flush();
  const have = (id) => fresh.counts.has(id);
  try {
    await waitFor(() => (fresh.check(), ackedIds.every(have)), { timeout: AFTER_MS - (Date.now() - tBack), interval: 50, what: () => `all ${N} acked messages at the new subscriber within ${AFTER_MS} ms of etcd's return (have ${ackedIds.filter(have).length})` });
    ctx.log(`all ${N} delivered ${Date.now() - tBack} ms after etcd came back`);
  } finally {
    const ready = await readyKeys(st.etcd, st.prefix, "orders").catch((e) => e.message);
    ctx.log(`outage report: delivered ${ackedIds.filter(have).length}/${N} to the new subscriber ${Date.now() - tBack} ms after etcd came back; ready keys now: ${JSON.stringify(ready)}`);
  }
  assertNoConsumerErrors([fresh]);
  assertCovers(ackedIds, [...fresh.counts.keys()], "acked backlog at the new subscriber");
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
}, { timeout: 90_000 });
