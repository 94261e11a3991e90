// e2e_redrive_api: the admin API call $FLUXON.API.CHANNEL.REDRIVE.<dlq> makes a bridge redrive
// (the operation `fluxonctl redrive` does, run by the bridge): 60 dead letters (+TERM with a
// reason) go back to orders at the requested rate with their headers, Fluxon-Redriven: 1 and a
// fresh delivery count; the answer reports them moved; a request naming a channel that is not a
// dead-letter channel gets 404, a bad body 400; `fluxonctl redrive --api` uses the call too.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, fluxonctl, SLOW, REDRIVE_JITTER_MS } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog, sc } from "./lib/client.mjs";
import { assert, assertSameSet, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_redrive_api", async (ctx) => {
  const st = await startStack(ctx);
  const ORDERS = { name: "orders", subjects: ["orders.>"], deliver_prefix: "q.orders", backoff: [], ack_wait: "60s" };
  const bridge = await st.bridge({ name: "rdapi", channels: [ORDERS] }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const N = 60;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("ra", i, "orders.ra"));
  const worker = new Consumer(nc, "q.orders.w", {
    ackMode: (m, rec) => (rec.headers && rec.headers.get("Fluxon-Redriven") ? "+ACK" : `+TERM bad ${rec.n}`),
  });
  await nc.flush();
  const res = await publishAll(nc, msgs, { concurrency: 32 });
  assert.equal(res.acked.size, N);
  await waitBacklog(nc, "orders", 0, 30_000 * SLOW);
  await waitBacklog(nc, "orders-dlq", N, 30_000 * SLOW);

  const api = async (subject, body, timeout = 5000) => {
    const r = await nc.request(subject, sc.encode(body), { timeout });
    return JSON.parse(sc.decode(r.data));
  };
  // refused requests
  let a = await api("$FLUXON.API.CHANNEL.REDRIVE.orders", "");
  assert.equal(a.error && a.error.code, 404, `a channel that is no DLQ: ${JSON.stringify(a)}`);
  a = await api("$FLUXON.API.CHANNEL.REDRIVE.orders-dlq", '{"rate":"fast"}');
  assert.equal(a.error && a.error.code, 400, `bad body: ${JSON.stringify(a)}`);
  await waitBacklog(nc, "orders-dlq", N, 5000 * SLOW); // nothing moved by them

  const before = worker.records.length;
  const t0 = Date.now();
  a = await api("$FLUXON.API.CHANNEL.REDRIVE.orders-dlq", JSON.stringify({ rate: 40, wait_ms: 1000 }), 60_000 * SLOW);
  ctx.log(`API redrive answer after ${Date.now() - t0} ms: ${JSON.stringify(a)}`);
  assert.equal(a.moved, N, "every letter moved");
  assert.equal(a.to, "orders");
  assert.equal(a.failed + a.uncertain + a.ack_unconfirmed, 0, "no failure");
  await waitFor(() => (worker.check(), worker.records.length - before >= N), { timeout: 20_000 * SLOW, what: "the redriven messages" });
  const again = worker.records.slice(before);
  assertSameSet(msgs.map((m) => m.id), again.map((r) => r.id), "redriven messages");
  for (const r of again) {
    assert.equal(r.headers.get("Fluxon-Redriven"), "1", `Fluxon-Redriven of ${r.id}`);
    assert.equal(r.delivered, 1, `fresh delivery count of ${r.id}`);
    assert.equal(r.xid, r.id, "publisher header kept");
  }
  const ats = again.map((r) => r.at);
  const span = Math.max(...ats) - Math.min(...ats);
  // 60 letters at 40/s leave the bridge over 59 x 25 ms = 1475 ms. The consumer sees each one
  // after its store batch commits and a delivery round, whose latency varies from batch to batch,
  // so the spacing it sees can shrink by that spread (REDRIVE_JITTER_MS); a redrive that ignored
  // its rate moves all 60 within a few batches, far below the bound.
  ctx.log(`redriven deliveries spread over ${span} ms (60 at 40/s: 1475 ms at the bridge)`);
  assert.ok(span >= 1475 - REDRIVE_JITTER_MS, `rate respected (${span} ms)`);
  await waitBacklog(nc, "orders-dlq", 0, 15_000 * SLOW);

  // fluxonctl through the API: nothing left, moved 0, exit 0
  const out = await fluxonctl(["--server", st.nats.url, "redrive", "orders-dlq", "--api", "--wait", "500ms"], 30_000 * SLOW);
  ctx.log(`fluxonctl redrive --api: exit ${out.code}: ${out.stdout.trim()} ${out.stderr.trim()}`);
  assert.equal(out.code, 0, out.stderr);
  assert.equal(JSON.parse(out.stdout.trim()).moved, 0);
  await waitBacklog(nc, "orders", 0, 15_000 * SLOW);
  assertNoConsumerErrors([worker]);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
});
