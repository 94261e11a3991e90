// e2e_poison_message_reaches_dlq: a message whose consumer never acks (it exits, or its bridge
// dies) must still reach the dead-letter channel after max_deliver attempts: the attempt count
// belongs to the message (persisted in etcd, bridge/attempts.h), not to the claim. max_deliver 3;
// five consumers of q.orders.w one after the other, each exiting without an ack, served by
// alternating bridges (a, b killed with SIGKILL right after its delivery, a, b, a): the message is
// delivered exactly 3 times with Fluxon-Delivered (and the ack subject's delivered token) 1, 2,
// 3, then appears once on the dead-letter channel; consumers 4 and 5 get nothing (each is closed
// only after its bridge holds its claim and has been watched delivering nothing for 1 s).
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, metricValue, SLOW } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAcked, waitBacklog } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

test("e2e_poison_message_reaches_dlq", async (ctx) => {
  const st = await startStack(ctx);
  // ack_wait long: no redelivery inside one claim; every attempt is made by a new claim.
  const defaults = { max_deliver: 3, ack_wait: "60s", ttl_seconds: 3 };
  const a = st.bridge({ name: "a", defaults });
  const b = st.bridge({ name: "b", defaults });
  await a.start();
  const ncP = await natsConnect(ctx, st.nats.url, "pub");
  const msg = makeMsg("poison", 0, "orders.poison");
  const pa = await publishAcked(ncP, msg);
  assert.ok(pa.ok, `publish: ${JSON.stringify(pa)}`);
  const dlq = new Consumer(ncP, "q.orders-dlq.d");
  await ncP.flush();

  const seen = []; // {consumer, bridge, delivered, token}
  const plan = ["a", "b", "a", "b", "a"];
  const bridges = { a, b };
  for (let i = 0; i < plan.length; i++) {
    const br = bridges[plan[i]];
    const other = bridges[plan[i] === "a" ? "b" : "a"];
    if (other.proc && other.proc.running) {
      if (i === 2) await other.kill9(); // b dies holding the claim (and the unacked message)
      else await other.stop();
    }
    if (!br.proc || !br.proc.running) await br.start();
    const nc = await natsConnect(ctx, st.nats.url, `c${i + 1}`);
    const c = new Consumer(nc, "q.orders.w", { ackMode: () => null }); // never acks
    await nc.flush();
    if (i < 3) {
      await c.waitUnique(1, 30_000, `delivery to consumer ${i + 1} via bridge ${plan[i]}`);
    } else {
      // The attempts are used up: the claim dead-letters the message instead of delivering it.
      // The claim serving this consumer must exist on its bridge (fluxon_claims counts claims
      // whose consumer is open) before the consumer's "nothing" means anything.
      await waitFor(async () => (metricValue(await br.metrics(), "fluxon_claims", { channel: "orders" }) || 0) >= 1,
        { timeout: 30_000, what: `bridge ${plan[i]} holds the claim of consumer ${i + 1}` });
      if (i === 3) await waitFor(() => dlq.records.length >= 1, { timeout: 30_000, what: "the dead letter" });
      await waitBacklog(ncP, "orders", 0, 30_000);
      // The claim is open and the channel is empty: a claim with something to hand out does it on
      // its first turn. Watch it for a while (a duration, not a sync): nothing is delivered by this
      // bridge, nothing else is dead-lettered, and the consumer stays empty.
      const QUIET_MS = 1000 * SLOW;
      const tq = Date.now();
      while (Date.now() - tq < QUIET_MS) {
        assert.equal(c.records.length, 0, `consumer ${i + 1} got a delivery: ${JSON.stringify(c.records.map((r) => [r.id, r.delivered]))}`);
        await new Promise((r) => setTimeout(r, 100)); // sampling period
      }
      const m = await br.metrics();
      const delivered = metricValue(m, "fluxon_delivered_total", { channel: "orders" }) || 0;
      const dead = metricValue(m, "fluxon_dead_lettered_total", { channel: "orders" }) || 0;
      assert.equal(delivered, 0, `bridge ${plan[i]} delivered ${delivered} message(s) on orders while serving consumer ${i + 1}`);
      assert.equal(dead, i === 3 ? 1 : 0, `bridge ${plan[i]} dead-lettered ${dead} message(s) while serving consumer ${i + 1} (want ${i === 3 ? 1 : 0})`);
    }
    for (const r of c.records) {
      seen.push({ consumer: i + 1, bridge: plan[i], delivered: r.delivered, token: Number(r.reply.split(".")[6]), id: r.id });
    }
    ctx.log(`consumer ${i + 1} (bridge ${plan[i]}): ${JSON.stringify(c.records.map((r) => r.delivered))}`);
    await nc.close(); // exits without acking
  }
  await dlq.waitUnique(1, 20_000, "the dead letter");
  ctx.log(`deliveries: ${JSON.stringify(seen)}; dead letter: reason ${dlq.records[0].deadReason}, ` +
    `Fluxon-Dead-Delivered ${dlq.records[0].headers.get("Fluxon-Dead-Delivered")}`);
  assert.deepEqual(seen.map((s) => s.delivered), [1, 2, 3], "Fluxon-Delivered across claims and bridges");
  assert.deepEqual(seen.map((s) => s.token), [1, 2, 3], "the ack subject's delivered token");
  assert.deepEqual(seen.map((s) => s.bridge), ["a", "b", "a"], "served by alternating bridges");
  assert.ok(seen.every((s) => s.id === msg.id));
  assert.equal(dlq.records.length, 1, "dead-lettered once");
  assert.equal(dlq.records[0].id, msg.id);
  assert.equal(dlq.records[0].deadReason, "max_deliver");
  assert.equal(dlq.records[0].headers.get("Fluxon-Dead-Delivered"), "3");
  await waitBacklog(ncP, "orders", 0);
  for (const br of [a, b]) if (br.proc && br.proc.running) assert.equal((await br.stop()).code, 0);
}, { timeout: 150_000 });
