// e2e_sigterm_drain: two bridges share the work; SIGTERM to one of them during an acked stream:
// it exits 0, its membership keys (role keys, sub-MPSC memberships, ready keys bound to its member
// leases) are removed at once (well before their TTL), the other bridge keeps its keys, every
// publish that got a success ack is still delivered later by the remaining bridge, and none is
// delivered twice: a graceful stop answers every pending publish (none retried after a timeout,
// so none stored twice) and waits for the acks of its deliveries before it lets its claims go
// (none redelivered).
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, membershipKeys } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog, waitClaims } from "./lib/client.mjs";
import { assert, assertCovers, assertNoConsumerErrors } from "./lib/check.mjs";

test("e2e_sigterm_drain", async (ctx) => {
  const TTL = 30; // long: keys that vanish within a few seconds were deleted, not expired
  const st = await startStack(ctx);
  const stay = st.bridge({ name: "stay", defaults: { ttl_seconds: TTL, ack_wait: "5s" } });
  const leave = st.bridge({ name: "leave", defaults: { ttl_seconds: TTL, ack_wait: "5s" } });
  const nc = await natsConnect(ctx, st.nats.url, "pub");
  const subNc = await natsConnect(ctx, st.nats.url, "sub");
  const s1 = new Consumer(subNc, "q.orders.s1");
  await subNc.flush();

  // "stay" first: the leases that exist now are not the leaving bridge's.
  await stay.start();
  await waitClaims(nc, "orders", 1);
  const warm = await publishAll(nc, [makeMsg("drain", 999_999, "orders.warm")], { retry: true, deadline: 10_000 });
  assert.equal(warm.acked.size, 1);
  await waitFor(() => s1.unique >= 1, { timeout: 10_000, what: "warm-up delivery" });
  const stayLeases = new Set((await st.etcd.range(`${st.prefix}/`)).map((k) => k.lease).filter((l) => l !== "0"));

  await leave.start();
  const N = 3000;
  const STOP_AT = 1000;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("drain", i, `orders.d${i % 3}`));
  let leaveKeys = [];
  let stopped = null;
  const res = await publishAll(nc, msgs, {
    concurrency: 128,
    retry: true,
    deadline: 120_000,
    timeout: 10_000,
    onAck: (m, ack, count) => {
      if (count === STOP_AT && !stopped) {
        stopped = (async () => {
          const keys = await membershipKeys(st.etcd, st.prefix);
          leaveKeys = keys.filter((k) => k.lease !== "0" && !stayLeases.has(k.lease));
          ctx.log(`SIGTERM to "leave" at ${count} acks; its membership keys: ${leaveKeys.length} of ${keys.length}`);
          const t0 = Date.now();
          const ex = await leave.stop({ timeout: 20_000 });
          ctx.log(`"leave" exited ${JSON.stringify(ex)} after ${Date.now() - t0} ms`);
          return ex;
        })();
      }
    },
  });
  assert.ok(stopped, "the bridge was stopped during the stream");
  const ex = await stopped;
  assert.equal(ex.killed, false, "drain finished before the deadline (no SIGKILL)");
  assert.equal(ex.code, 0, `exit of the drained bridge: ${JSON.stringify(ex)}`);
  assert.ok(leaveKeys.length > 0, "the leaving bridge held membership keys (lease-identified)");
  // Removed at once: gone right after exit (a short bounded wait, far below the 30 s TTL).
  const leaveLeases = new Set(leaveKeys.map((k) => k.lease));
  let left = [];
  try {
    await waitFor(async () => {
      left = (await membershipKeys(st.etcd, st.prefix)).filter((k) => leaveLeases.has(k.lease));
      return left.length === 0;
    }, { timeout: 2000, what: "membership keys of the stopped bridge removed" });
  } catch (e) {
    throw new Error(`${e.message}: ${left.map((k) => k.key).join(" ")}`);
  }
  const stayKeys = (await membershipKeys(st.etcd, st.prefix)).filter((k) => stayLeases.has(k.lease));
  assert.ok(stayKeys.length > 0, "the remaining bridge keeps its membership keys");

  // The drain answers every pending publish: no publish went unanswered (a timeout); while the
  // capture subscription moves over, a publish may meet no responder (503) and is retried.
  ctx.log(`publish errors during the drain (retried): ${JSON.stringify([...res.errCodes])}`);
  assert.equal(res.errCodes.get("TIMEOUT") || 0, 0, "publishes left unanswered by the draining bridge");
  assert.equal(res.failed.size, 0, `never acked: ${res.failed.size}; first: ${JSON.stringify([...res.failed.values()][0])}`);
  // Whatever the stopped bridge stored is delivered later by the remaining one, to the same
  // subscriber (the sub-MPSCs the stopped bridge released are taken over).
  const ackedIds = [...res.acked.keys()];
  const have = (id) => s1.counts.has(id);
  await waitFor(() => ackedIds.every(have), { timeout: 60_000, interval: 200, what: () => `every acked publish delivered (${ackedIds.filter(have).length}/${ackedIds.length})` });
  await waitBacklog(nc, "orders", 0, 20_000);
  assertNoConsumerErrors([s1]);
  assertCovers(ackedIds, [...s1.counts.keys()], "acked publishes after SIGTERM");
  const dups = s1.duplicates();
  ctx.log(`delivered ${s1.unique} distinct to s1, duplicated ids: ${dups.length}`);
  const show = ([id]) => `${id}: ` + s1.records.filter((r) => r.id === id)
    .map((r) => `${r.reply.split(".")[3]}/${r.headers ? r.headers.get("Fluxon-Id") : "?"}/d${r.delivered}`).join(",");
  assert.equal(dups.length, 0, `a graceful drain delivered ${dups.length} id(s) twice: ${dups.slice(0, 5).map(show).join("; ")}`);
  // the remaining bridge delivered after the stop: the ack subjects name it
  const lastFrom = s1.records.slice(-20).map((r) => r.reply.split(".")[3]);
  assert.ok(lastFrom.every((b) => b === "stay"), `last deliveries came from: ${[...new Set(lastFrom)].join(",")}`);
  const ex2 = await stay.stop();
  assert.equal(ex2.code, 0, `exit of the remaining bridge: ${JSON.stringify(ex2)}`);
  stay.assertLogClean();
  leave.assertLogClean();
}, { timeout: 200_000 });
