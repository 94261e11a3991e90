// e2e_interest_release: the subscriber leaves; within release_after + 2 s the claim is released
// (its ready key is gone from etcd, the admin API shows no ready sub-MPSC); a new subscriber on
// another name receives the remaining backlog, and nothing that was acked comes back. Nothing is
// delivered to the name that left once the bridge has had time to see it go (interest_poll), even
// though its unacked messages come due for redelivery (ack_wait 1 s) before the release
// (release_after 4 s x slow factor): a wildcard spy on q.orders.* (a wildcard creates no claim
// and is no interest for one) sees every delivery the bridge makes to q.orders.first.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, readyKeys, metricValue, SLOW } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog, channelInfo, readyCount } from "./lib/client.mjs";
import { assert, assertCovers, assertSameSet, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_interest_release", async (ctx) => {
  const ACK_WAIT_MS = 1000;
  // The bridge sees a departure within a few interest polls (200 ms); generous on a loaded machine,
  // and still well inside release_after (both stretched on slow builds), so the window between
  // them holds redeliveries that come due.
  const DETECT_MS = 1500 * SLOW;
  const RELEASE_MS = 4000 * SLOW;
  const st = await startStack(ctx);
  const bridge = await st.bridge({
    name: "rel",
    defaults: { release_after: `${RELEASE_MS}ms`, interest_poll: "200ms", max_ack_pending: 10, ack_wait: `${ACK_WAIT_MS}ms`, max_deliver: 20 },
  }).start();
  const spyNc = await natsConnect(ctx, st.nats.url, "spy");
  const spy = new Consumer(spyNc, "q.orders.*", { ackMode: "none" }); // never answers
  await spyNc.flush();
  const toFirst = () => spy.records.filter((r) => r.subject === "q.orders.first");
  const nc = await natsConnect(ctx, st.nats.url);
  const N = 200;
  const ACKED = 50;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("rel", i, "orders.rel"));
  const res = await publishAll(nc, msgs, { concurrency: 64 });
  assert.equal(res.acked.size, N);

  // First subscriber acks the first ACKED deliveries, then goes quiet and leaves.
  const subNc = await natsConnect(ctx, st.nats.url, "first");
  const ackedIds = new Set();
  const first = new Consumer(subNc, "q.orders.first", {
    ackMode: (m, rec) => {
      if (ackedIds.size < ACKED) {
        ackedIds.add(rec.id);
        return "+ACK";
      }
      return null;
    },
  });
  await waitFor(() => ackedIds.size >= ACKED, { timeout: 20_000, what: `${ACKED} acks by the first subscriber` });
  await subNc.flush(); // the acks reached the server
  const ready = await waitFor(async () => {
    const r = await readyKeys(st.etcd, st.prefix, "orders");
    return r.length >= 1 ? r : null;
  }, { timeout: 5000, what: "a ready key while subscribed" });
  ctx.log(`claim held: ${ready.map((k) => `${k.key}=${k.value}`).join(" ")}; first got ${first.records.length} deliveries`);

  // at most max_ack_pending (10) unacked messages on the claim (redeliveries of them aside)
  assert.ok(first.unique <= ACKED + 10, `messages delivered to the first subscriber ${first.unique} > acked + max_ack_pending`);
  await first.unsubscribe();
  const tLeave = Date.now();
  await waitFor(async () => (await readyKeys(st.etcd, st.prefix, "orders")).length === 0,
    { timeout: RELEASE_MS + 2000, interval: 25, what: "ready key removed within release_after + 2 s" });
  const tReleased = Date.now();
  ctx.log(`claim released ${Date.now() - tLeave} ms after the subscriber left`);
  const info = await channelInfo(nc, "orders");
  assert.equal(readyCount(info), 0, `admin shows no claimed sub-MPSC: ${JSON.stringify(info.sub_mpscs)}`);
  const claims = metricValue(await bridge.metrics(), "fluxon_claims", { channel: "orders" });
  assert.equal(claims, 0, "fluxon_claims gauge back to 0");
  const deliveredToFirst = first.records.length;
  assert.ok(toFirst().length >= deliveredToFirst, `the spy saw the deliveries to the first subscriber (${toFirst().length} < ${deliveredToFirst})`);

  // The remaining backlog goes to a new name.
  const second = new Consumer(nc, "q.orders.second");
  const remaining = msgs.map((m) => m.id).filter((id) => !ackedIds.has(id));
  await waitFor(() => remaining.every((id) => second.counts.has(id)), { timeout: 30_000, what: () => `remaining ${remaining.length} on the second subscriber (have ${second.unique})` });
  await waitBacklog(nc, "orders", 0, 15_000);
  assertNoConsumerErrors([first, second]);
  assertCovers(remaining, [...second.counts.keys()], "remaining backlog");
  assertSameSet(msgs.map((m) => m.id), [...ackedIds, ...second.counts.keys()], "acked by first + second");
  const back = [...second.counts.keys()].filter((id) => ackedIds.has(id));
  assert.equal(back.length, 0, `acked messages delivered again: ${back.join(",")}`);
  // Nothing delivered to the name that left, seen from the server's side (the spy): after the
  // bridge had time to notice, neither the redeliveries that came due nor anything else.
  const late = toFirst().filter((r) => r.at > tLeave + DETECT_MS);
  const soon = toFirst().filter((r) => r.at > tLeave && r.at <= tLeave + DETECT_MS);
  ctx.log(`first: ${deliveredToFirst} deliveries, ${ACKED} acked; second: ${second.unique}; deliveries to q.orders.first after it left: ` +
    `${soon.length} within ${DETECT_MS} ms, ${late.length} later (released after ${tReleased - tLeave} ms)`);
  assert.equal(late.length, 0, `${late.length} deliveries to q.orders.first after its subscriber left, e.g. ` +
    late.slice(0, 5).map((r) => `${r.id} (Fluxon-Delivered ${r.delivered}) ${r.at - tLeave} ms after`).join(", "));
  assert.ok(soon.length <= 10, `${soon.length} deliveries to q.orders.first while the bridge noticed the departure > max_ack_pending`);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
});
