// e2e_nats_restart: nats-server is restarted (same ports) in the middle of an acked stream (while
// it is down the bridge's /healthz is 503); the bridge reconnects (its /healthz comes back to ok), the claim resumes for the re-subscribed
// consumer, and every acked publish is delivered (duplicates counted and reported).
import { test } from "./lib/runner.mjs";
import { startStack, waitFor } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog, waitClaims } from "./lib/client.mjs";
import { assert, assertCovers, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_nats_restart", async (ctx) => {
  const st = await startStack(ctx);
  const bridge = await st.bridge({ name: "nr", defaults: { ack_wait: "5s" } }).start();
  const pubNc = await natsConnect(ctx, st.nats.url, "pub");
  const subNc = await natsConnect(ctx, st.nats.url, "sub");
  const c = new Consumer(subNc, "q.orders.r");
  await subNc.flush();
  await waitClaims(pubNc, "orders", 1);

  const N = 3000;
  const RESTART_AT = 1000;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("nr", i, "orders.nr"));
  let restart = null;
  let healthDown = null;
  const res = await publishAll(pubNc, msgs, {
    concurrency: 128,
    retry: true,
    deadline: 120_000,
    timeout: 5000,
    onAck: (m, ack, count) => {
      if (count === RESTART_AT && !restart) {
        restart = (async () => {
          ctx.log(`restarting nats-server at ${count} acks (delivered ${c.unique})`);
          await st.nats.stop();
          // while NATS is away the bridge reports itself unhealthy
          healthDown = await waitFor(async () => {
            const h = await bridge.health();
            return h.status === 503 ? h : null;
          }, { timeout: 10_000, interval: 25, what: "/healthz 503 while nats-server is down" }).catch((e) => ({ error: e.message }));
          await st.nats.start();
          ctx.log("nats-server back");
        })();
      }
    },
  });
  assert.ok(restart, "nats-server was restarted during the stream");
  await restart;
  assert.equal(res.failed.size, 0, `never acked: ${res.failed.size}; first: ${JSON.stringify([...res.failed.values()][0])}`);
  const retried = [...res.attempts.values()].filter((a) => a > 1).length;

  ctx.log(`healthz while nats-server was down: ${healthDown.text || healthDown.error}`);
  assert.equal(healthDown.status, 503, `healthz while nats-server was down: ${JSON.stringify(healthDown)}`);
  assert.equal(healthDown.json && healthDown.json.status, "error");
  await bridge.waitHealthy(20_000);
  const ackedIds = [...res.acked.keys()];
  try {
    await waitFor(() => ackedIds.every((id) => c.counts.has(id)), { timeout: 90_000, interval: 200, what: () => `every acked publish delivered (have ${c.unique}/${N})` });
  } finally {
    const dups = c.duplicates();
    ctx.log(`nats restart report: published ${N}, acked ${res.acked.size}, retried ${retried}, deliveries ${c.records.length}, distinct ${c.unique}, duplicated ids ${dups.length}`);
  }
  await waitBacklog(pubNc, "orders", 0, 30_000);
  assertNoConsumerErrors([c]);
  assertCovers(ackedIds, [...c.counts.keys()], "acked publishes across a nats-server restart");
  // The bridge still captures and delivers after the restart (a fresh message end to end).
  const tail = makeMsg("nr", N + 1, "orders.after");
  const r = await publishAll(pubNc, [tail], { retry: true, deadline: 20_000 });
  assert.equal(r.acked.size, 1);
  await waitFor(() => c.counts.has(tail.id), { timeout: 15_000, what: "a delivery after the restart" });
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
}, { timeout: 200_000 });
