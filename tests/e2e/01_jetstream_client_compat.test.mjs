// e2e_jetstream_client_compat: the npm client's JetStream API against a capture subject.
// jetstream().publish() returns a PubAck whose stream is the channel; a delivery's reply subject
// parses as JetStream ack metadata (stream = channel, consumer = claim, delivered count right),
// and the client's JsMsg ack/nak/working/term helpers drive the bridge.
//
// Note: nats-server (2.2 and later, 2.9.10 here) refuses a CLIENT publish whose reply subject
// starts with "$JS.ACK." ("Publish Violation", isReservedReply). The bridge therefore delivers
// through the server's leafnode listener (nats.leaf_url), where that check does not apply, and
// the npm client's own JetStream parser reads the reply; the final assertion checks that every
// reply carries the literal "$JS.ACK." prefix of the contract.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, toJsMsg, parseInfo, waitClaims, waitBacklog, channelInfo } from "./lib/client.mjs";
import { assert, assertSameSet } from "./lib/check.mjs";

/** The npm client's JetStream metadata of a reply subject; a non-"$JS" prefix is mapped first. */
function jsInfo(reply) {
  const t = reply.split(".");
  if (t[0] === "$JS" && t[1] === "ACK") return parseInfo(reply);
  return parseInfo(["$JS", "ACK", ...t.slice(2)].join("."));
}

test("e2e_jetstream_client_compat", async (ctx) => {
  const st = await startStack(ctx);
  const bridge = await st.bridge({ name: "jsc", leaf: true }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const js = nc.jetstream();

  // Publish with the JetStream client: the PubAck comes from the bridge.
  const N = 20;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("jsc", i, i % 2 ? "orders.eu.new" : "orders.us.paid"));
  const pubAcks = new Map();
  for (const m of msgs) {
    const pa = await js.publish(m.subject, m.data, { headers: m.headers, timeout: 10_000 });
    assert.equal(pa.stream, "orders", `PubAck stream of ${m.id}`);
    assert.ok(Number.isInteger(pa.seq) && pa.seq > 0, `PubAck seq of ${m.id}: ${pa.seq}`);
    assert.ok(!pa.duplicate, "PubAck duplicate flag");
    pubAcks.set(m.id, pa.seq);
  }
  assert.equal(new Set(pubAcks.values()).size, N, "PubAck seqs are distinct");
  ctx.log(`published ${N} with js.publish, seqs ${[...pubAcks.values()].slice(0, 5).join(",")}...`);

  // A JetStream client publishing to a subject nobody captures gets an error, not a PubAck.
  await assert.rejects(js.publish("nocapture.here", new Uint8Array(1), { timeout: 2000 }), "publish to an uncaptured subject");

  // Consume as claim "alice" with JsMsg helpers. Message 0: NAK once, then ack. Message 2: NAK
  // with a delay once, then ack. Message 1: working (+WPI) then ack. Others: ack.
  const seen = [];
  const prefixes = new Set();
  const consumer = new Consumer(nc, "q.orders.alice", {
    ackMode: (m, rec) => {
      const jm = toJsMsg(m); // ack(), nak(), working(), term() answer on the reply subject
      prefixes.add(rec.reply.split(".").slice(0, 2).join("."));
      const info = jsInfo(rec.reply); // the npm client's parser (what jm.info returns for $JS.ACK)
      seen.push({ id: rec.id, info, rec });
      if (rec.n === 0 && info.deliveryCount === 1) jm.nak();
      else if (rec.n === 2 && info.deliveryCount === 1) jm.nak(100); // -NAK {"delay":100000000}
      else if (rec.n === 1 && info.deliveryCount === 1) {
        jm.working();
        jm.ack();
      } else jm.ack();
      return null;
    },
  });
  await consumer.waitUnique(N, 30_000);
  await waitFor(() => [0, 2].every((n) => seen.some((s) => s.rec.n === n && s.info.deliveryCount === 2)), { timeout: 15_000, what: "redelivery of the NAKed messages" });
  await waitBacklog(nc, "orders", 0, 15_000);
  assert.equal(consumer.errors.length, 0, consumer.errors.map(String).join("; "));

  assertSameSet(msgs.map((m) => m.id), [...consumer.counts.keys()], "claim alice");
  for (const s of seen) {
    const { info, rec } = s;
    assert.equal(rec.reply.split(".").length, 12, `12-token ack subject: ${rec.reply}`);
    assert.equal(rec.reply.split(".")[2], "FLUXON", `domain token of ${rec.reply}`);
    assert.equal(rec.reply.split(".")[3], "jsc", `bridge token of ${rec.reply}`);
    assert.equal(info.stream, "orders", `stream of ${rec.id}`);
    assert.equal(info.consumer, "alice", `consumer of ${rec.id}`);
    assert.equal(info.deliveryCount, rec.delivered, `deliveryCount = Fluxon-Delivered for ${rec.id}`);
    assert.equal(String(info.streamSequence), rec.seq, `streamSequence = Fluxon-Seq for ${rec.id}`);
    assert.equal(info.streamSequence, pubAcks.get(rec.id), `streamSequence = PubAck seq for ${rec.id}`);
    assert.ok(info.deliverySequence > 0, "delivery (claim) sequence");
    assert.ok(info.timestampNanos > 1.6e18, `timestamp ns ${info.timestampNanos}`);
    assert.ok(info.pending >= 0, "pending");
    assert.equal(rec.channel, "orders");
  }
  const zero = seen.filter((s) => s.rec.n === 0).map((s) => s.info.deliveryCount);
  assert.deepEqual(zero, [1, 2], "message 0 delivered twice (NAK), counts 1 then 2");
  const two = seen.filter((s) => s.rec.n === 2).map((s) => s.info.deliveryCount);
  assert.deepEqual(two, [1, 2], "message 2 delivered twice (NAK with delay), counts 1 then 2");
  const others = seen.filter((s) => s.rec.n !== 0 && s.rec.n !== 2);
  assert.equal(others.length, N - 2, "every other message delivered exactly once");
  assert.ok(others.every((s) => s.info.deliveryCount === 1 && !s.info.redelivered));
  // delivery (claim) sequences are distinct per claim
  assert.equal(new Set(seen.map((s) => s.info.deliverySequence)).size, seen.length, "claim seqs distinct");

  // +TERM through the client helper dead-letters at once, with delivered count 1.
  const dlq = new Consumer(nc, "q.orders-dlq.alice");
  consumer.ackMode = (m) => {
    toJsMsg(m).term();
    return null;
  };
  const t = makeMsg("jsc", 100, "orders.eu.term");
  const pa = await js.publish(t.subject, t.data, { headers: t.headers });
  assert.equal(pa.stream, "orders");
  await dlq.waitUnique(1, 20_000);
  const d = dlq.records[0];
  assert.equal(d.id, t.id);
  assert.ok(d.deadReason, "Fluxon-Dead-Reason set on the dead letter");
  const dinfo = jsInfo(d.reply);
  assert.equal(dinfo.stream, "orders-dlq");
  assert.equal(dinfo.consumer, "alice");
  await waitBacklog(nc, "orders", 0);
  await waitBacklog(nc, "orders-dlq", 0);
  const info = await channelInfo(nc, "orders");
  ctx.log(`channel info after: backlog ${info.backlog}`);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);

  // The contract's literal prefix, last (see the note at the top of this file).
  assert.deepEqual([...prefixes], ["$JS.ACK"],
    `delivery reply subjects start with ${[...prefixes].join(",")}, not "$JS.ACK" as the contract says`);
});
