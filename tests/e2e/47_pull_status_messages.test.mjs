// e2e_pull_status_messages: pull requests ($JS.API.CONSUMER.MSG.NEXT.<channel>.<consumer>) get
// JetStream's status messages from the bridge: no_wait on an empty consumer -> 404 No Messages;
// a request that expires -> 408 Request Timeout with Nats-Pending-Messages / Nats-Pending-Bytes
// (what it still wanted, also after a partial batch); idle_heartbeat -> 100 Idle Heartbeat while
// it waits; a body that is not a request -> 400 Bad Request; a batch over the consumer's
// max_batch / max_bytes / max_expires -> 409 Exceeded MaxRequestBatch / MaxRequestMaxBytes /
// MaxRequestExpires; a message larger than a request's bytes left -> 409 Message Size Exceeds
// MaxBytes (the message goes to the next request); past
// max_waiting -> 409 Exceeded MaxWaiting; a deleted consumer -> 409 Consumer Deleted to the
// requests still waiting. The messages of a partial batch carry "$JS.ACK." replies and their acks
// empty the backlog.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor } from "./lib/stack.mjs";
import { natsConnect, makeMsg, publishAll, waitBacklog, parseBody } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

const NEXT = "$JS.API.CONSUMER.MSG.NEXT.orders.st";

test("e2e_pull_status_messages", async (ctx) => {
  const st = await startStack(ctx);
  const b = await st.bridge({ name: "s1" }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const jsm = await nc.jetstreamManager();
  await jsm.consumers.add("orders", { durable_name: "st", ack_policy: "explicit", ack_wait: 10e9, max_waiting: 3, max_batch: 20,
    max_bytes: 200000, max_expires: 60e9 });

  // A pull request on its own inbox; resolves with everything received once a terminal status
  // (anything but 100) came or the batch is complete, or after `wait` ms.
  const pull = (body, wait = 15_000) => {
    const inbox = nc.options.inboxPrefix ? `${nc.options.inboxPrefix}.${Math.random()}` : `_INBOX.st${Date.now()}${Math.floor(Math.random() * 1e9)}`;
    const got = [];
    const sub = nc.subscribe(inbox);
    const done = (async () => {
      const timer = setTimeout(() => sub.unsubscribe(), wait);
      for await (const m of sub) {
        const code = m.headers?.code || 0;
        got.push({ code, desc: m.headers?.description, pm: m.headers?.get("Nats-Pending-Messages"), pb: m.headers?.get("Nats-Pending-Bytes"), reply: m.reply, data: m.data, at: Date.now(), msg: m });
        if (code && code !== 100) break;
        if (!code && got.filter((x) => !x.code).length === (body.batch || 1)) break; // batch complete: no status follows
      }
      clearTimeout(timer);
      sub.unsubscribe();
      return got;
    })();
    nc.publish(NEXT, typeof body === "string" ? body : JSON.stringify(body), { reply: inbox });
    return { done, got };
  };
  const statuses = (g) => g.filter((x) => x.code).map((x) => `${x.code} ${x.desc}`);

  // no_wait, nothing stored: 404
  let g = await pull({ batch: 1, no_wait: true }).done;
  assert.deepEqual(statuses(g), ["404 No Messages"], "no_wait on an empty consumer");

  // expires: 408 with what it still wanted
  let t0 = Date.now();
  g = await pull({ batch: 5, expires: 1e9 }).done;
  ctx.log(`408 after ${Date.now() - t0} ms`);
  assert.deepEqual(statuses(g), ["408 Request Timeout"]);
  assert.equal(g[0].pm, "5", "Nats-Pending-Messages");
  assert.equal(g[0].pb, "0", "Nats-Pending-Bytes");
  assert.ok(Date.now() - t0 >= 900, "not before expires");

  // idle heartbeats while it waits, then 408
  g = await pull({ batch: 2, expires: 2.6e9, idle_heartbeat: 0.5e9, max_bytes: 100000 }).done;
  const hb = g.filter((x) => x.code === 100);
  ctx.log(`heartbeats: ${hb.length}; statuses ${statuses(g).join(", ")}`);
  assert.ok(hb.length >= 3, `100 Idle Heartbeat every 500 ms (got ${hb.length})`);
  assert.equal(hb[0].desc, "Idle Heartbeat");
  assert.equal(g.at(-1).code, 408);
  assert.equal(g.at(-1).pm, "2");
  assert.equal(g.at(-1).pb, "100000", "bytes still wanted");

  // a partial batch: 2 messages, then 408 pending 3; acks on the $JS.ACK replies commit them
  let res = await publishAll(nc, [0, 1].map((i) => makeMsg("st", i, "orders.st")));
  assert.equal(res.acked.size, 2);
  await waitBacklog(nc, "orders", 2);
  g = await pull({ batch: 5, expires: 2e9 }).done;
  const msgs = g.filter((x) => !x.code);
  assert.equal(msgs.length, 2, "both stored messages");
  assert.deepEqual(msgs.map((x) => parseBody(x.data).id).sort(), ["st-0", "st-1"]);
  assert.equal(g.at(-1).code, 408);
  assert.equal(g.at(-1).pm, "3", "3 still wanted");
  // CONSUMER.INFO from the claim's engine: 2 delivered, awaiting their ack
  let ci = await waitFor(async () => {
    const x = await jsm.consumers.info("orders", "st");
    return x.num_ack_pending === 2 ? x : null;
  }, { timeout: 5000, what: "num_ack_pending 2" });
  assert.equal(ci.delivered.consumer_seq, 2, "delivered consumer seq");
  assert.equal(ci.num_redelivered, 0);
  for (const x of msgs) {
    assert.match(x.reply, /^\$JS\.ACK\./, "a JetStream ack reply");
    x.msg.respond(new Uint8Array(0)); // +ACK
  }
  await waitBacklog(nc, "orders", 0);
  ci = await waitFor(async () => {
    const x = await jsm.consumers.info("orders", "st");
    return x.num_ack_pending === 0 ? x : null;
  }, { timeout: 5000, what: "num_ack_pending 0" });
  assert.equal(ci.ack_floor.consumer_seq, 2, "ack floor after both acks");

  // not a pull request: 400, as a status (a JSON error body would be taken for a message)
  g = await pull("{not json").done;
  assert.deepEqual(statuses(g), ["400 Bad Request"]);

  // over the consumer's max_batch
  g = await pull({ batch: 21, expires: 1e9 }).done;
  assert.deepEqual(statuses(g), ["409 Exceeded MaxRequestBatch of 20"]);

  // over the consumer's max_bytes / max_expires
  g = await pull({ batch: 1, max_bytes: 300000, expires: 1e9 }).done;
  assert.deepEqual(statuses(g), ["409 Exceeded MaxRequestMaxBytes of 200000"]);
  g = await pull({ batch: 1, expires: 90e9 }).done;
  assert.deepEqual(statuses(g), ["409 Exceeded MaxRequestExpires of 1m0s"]);
  // a message larger than the bytes the request has left: 409, the message stays for another
  res = await publishAll(nc, [makeMsg("st", 9, "orders.st")]);
  assert.equal(res.acked.size, 1);
  g = await pull({ batch: 1, max_bytes: 10, expires: 2e9 }).done;
  assert.deepEqual(statuses(g), ["409 Message Size Exceeds MaxBytes"]);
  g = await pull({ batch: 1, expires: 5e9 }).done;
  assert.equal(g.filter((x) => !x.code).map((x) => parseBody(x.data).id).join(), "st-9", "then served to the next request");
  g.filter((x) => !x.code)[0].msg.respond(new Uint8Array(0));
  await waitBacklog(nc, "orders", 0);

  // max_waiting 3: a 4th waiting request is refused; deleting the consumer answers the 3
  const waiting = [0, 1, 2].map(() => pull({ batch: 1, expires: 30e9 }, 40_000));
  await new Promise((r) => setTimeout(r, 300));
  ci = await jsm.consumers.info("orders", "st");
  assert.equal(ci.num_waiting, 3, "num_waiting in CONSUMER.INFO");
  g = await pull({ batch: 1, expires: 30e9 }).done;
  assert.deepEqual(statuses(g), ["409 Exceeded MaxWaiting"]);
  t0 = Date.now();
  assert.equal(await jsm.consumers.delete("orders", "st"), true);
  for (const w of waiting) assert.deepEqual(statuses(await w.done), ["409 Consumer Deleted"]);
  ctx.log(`409 Consumer Deleted after ${Date.now() - t0} ms`);
  assert.ok(Date.now() - t0 < 10_000, "answered at once, not at expiry");
  // a pull for a consumer that does not exist
  g = await pull({ batch: 1, expires: 1e9 }).done;
  assert.deepEqual(statuses(g), ["409 Consumer Deleted"]);

  const ex = await b.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  b.assertLogClean();
}, { timeout: 120_000 });
