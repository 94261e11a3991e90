// e2e_admin_and_ops: fluxonctl info/channels and the admin API show a backlog equal to published
// minus consumed (acked); /metrics counters match the counts; /healthz is 200 {"status":"ok"} and
// turns 503 {"status":"error","error":...} when etcd is stopped (and back to 200 when it returns);
// SIGHUP reloads the channel list (an added channel captures at once); the admin answer has its
// documented structure; fluxonctl pub --ack and sub work.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, metricValue, fluxonctl, httpGet } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog, channelInfo, adminRequest, waitClaims } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

test("e2e_admin_and_ops", async (ctx) => {
  const st = await startStack(ctx);
  const ORDERS_CH = { name: "orders", subjects: ["orders.>"], deliver_prefix: "q.orders" };
  const DEMO_CH = { name: "demo", subjects: ["demo.>"], deliver_prefix: "q.demo" };
  const bridge = await st.bridge({ name: "ops", defaults: { max_ack_pending: 20 }, channels: [ORDERS_CH, DEMO_CH] }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const server = ["--server", st.nats.url];

  const N = 300;
  const CONSUMED = 100;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("ops", i, "orders.ops"));
  const res = await publishAll(nc, msgs, { concurrency: 64 });
  assert.equal(res.acked.size, N);
  await waitBacklog(nc, "orders", N);

  let out = await fluxonctl([...server, "info", "orders"]);
  assert.equal(out.code, 0, `fluxonctl info: ${out.stderr}`);
  ctx.log(`fluxonctl info orders:\n${out.stdout.trimEnd()}`);
  assert.match(out.stdout, /Backlog:\s+300\b/, "fluxonctl info shows the backlog");
  out = await fluxonctl([...server, "channels"]);
  assert.equal(out.code, 0, `fluxonctl channels: ${out.stderr}`);
  const row = out.stdout.split("\n").find((l) => /^orders\s/.test(l));
  assert.ok(row, `orders listed by fluxonctl channels:\n${out.stdout}`);
  assert.match(row, /\s300\s*$/, `backlog column of orders: ${row}`);
  assert.ok(out.stdout.split("\n").some((l) => /^orders-dlq\s/.test(l)), "the DLQ channel is listed");
  out = await fluxonctl([...server, "info", "orders", "--json"]);
  assert.equal(out.code, 0);
  assert.equal(JSON.parse(out.stdout).backlog, N, "fluxonctl info --json backlog");
  out = await fluxonctl([...server, "info", "no-such-channel"]);
  assert.notEqual(out.code, 0, "info on an unknown channel fails");
  // CHANNEL.INFO structure: sub-MPSCs with ready state and owner, producers with produce and
  // consume offsets, members; backlogs add up.
  const full = await channelInfo(nc, "orders");
  assert.ok(Array.isArray(full.sub_mpscs) && full.sub_mpscs.length >= 1, `sub_mpscs: ${JSON.stringify(full)}`);
  let sumSub = 0;
  for (const sm of full.sub_mpscs) {
    assert.equal(typeof sm.ready, "boolean", "sub-MPSC ready flag");
    assert.ok("owner_member" in sm, "sub-MPSC owner");
    assert.ok(Array.isArray(sm.producers), "sub-MPSC producers");
    let sumProd = 0;
    for (const p of sm.producers) {
      assert.ok(Number.isInteger(p.produce_offset) && Number.isInteger(p.consume_offset), `offsets ${JSON.stringify(p)}`);
      sumProd += p.produce_offset - p.consume_offset + 1;
    }
    assert.equal(sumProd, sm.backlog, `sub-MPSC backlog = sum of producer backlogs: ${JSON.stringify(sm)}`);
    sumSub += sm.backlog;
  }
  assert.equal(sumSub, N, "channel backlog = sum of sub-MPSC backlogs");
  assert.ok(full.members && Array.isArray(full.members.producers) && full.members.producers.length >= 1, `members: ${JSON.stringify(full.members)}`);

  // fluxonctl pub --ack / sub helpers (on a channel of their own: the backlog count stays exact)
  out = await fluxonctl([...server, "pub", "demo.hello", "hi there", "--ack", "-H", "X-Demo:1"]);
  assert.equal(out.code, 0, `fluxonctl pub --ack: ${out.stderr}`);
  const pa = JSON.parse(out.stdout.trim().split("\n").pop());
  assert.equal(pa.stream, "demo", `fluxonctl pub --ack prints the PubAck: ${out.stdout}`);
  out = await fluxonctl([...server, "sub", "q.demo.cli", "--ack", "--count", "1", "--timeout", "10s"], 20_000);
  assert.equal(out.code, 0, `fluxonctl sub: ${out.stderr}`);
  assert.match(out.stdout, /hi there/, `fluxonctl sub prints the data: ${out.stdout}`);
  assert.match(out.stdout, /X-Demo: 1/, "fluxonctl sub prints the headers");
  await waitBacklog(nc, "demo", 0);

  const list = await adminRequest(nc, "$FLUXON.API.CHANNEL.LIST");
  assert.ok(list.channels.some((c) => c.name === "orders" && c.backlog === N), `CHANNEL.LIST ${JSON.stringify(list)}`);
  const binfo = await adminRequest(nc, "$FLUXON.API.INFO");
  ctx.log(`$FLUXON.API.INFO: ${JSON.stringify(binfo).slice(0, 200)}`);

  // Consume exactly CONSUMED (ack the first CONSUMED deliveries, then leave).
  let acked = 0;
  const c = new Consumer(nc, "q.orders.c", { ackMode: () => (acked < CONSUMED ? (acked++, "+ACK") : null) });
  await waitFor(() => acked >= CONSUMED, { timeout: 20_000, what: `${CONSUMED} acks` });
  await waitClaims(nc, "orders", 1);
  const claimsWhile = metricValue(await bridge.metrics(), "fluxon_claims", { channel: "orders" });
  await c.unsubscribe();
  await waitBacklog(nc, "orders", N - CONSUMED, 15_000);
  out = await fluxonctl([...server, "info", "orders"]);
  assert.match(out.stdout, new RegExp(`Backlog:\\s+${N - CONSUMED}\\b`), `fluxonctl info after consuming: ${out.stdout}`);

  // /metrics: counters match.
  const m = await waitFor(async () => {
    const s = await bridge.metrics();
    return metricValue(s, "fluxon_backlog", { channel: "orders" }) === N - CONSUMED &&
      metricValue(s, "fluxon_claims", { channel: "orders" }) === 0 ? s : null;
  }, { timeout: 10_000, what: "backlog and claims gauges" });
  const v = (name) => metricValue(m, name, { channel: "orders" });
  ctx.log(`metrics: captured ${v("fluxon_captured_total")} delivered ${v("fluxon_delivered_total")} acked ${v("fluxon_acked_total")} redelivered ${v("fluxon_redelivered_total")} dead ${v("fluxon_dead_lettered_total")} dropped ${v("fluxon_dropped_total")} backlog ${v("fluxon_backlog")} claims ${claimsWhile}->${v("fluxon_claims")}`);
  assert.equal(v("fluxon_captured_total"), N, "fluxon_captured_total");
  assert.equal(v("fluxon_acked_total"), CONSUMED, "fluxon_acked_total");
  assert.ok(v("fluxon_delivered_total") >= c.records.length, `fluxon_delivered_total ${v("fluxon_delivered_total")} >= received ${c.records.length}`);
  assert.ok(v("fluxon_delivered_total") <= CONSUMED + 20 + 20, "delivered bounded by acked + max_ack_pending (+ in flight)");
  assert.equal(v("fluxon_redelivered_total"), 0, "fluxon_redelivered_total");
  assert.equal(v("fluxon_dead_lettered_total"), 0, "fluxon_dead_lettered_total");
  assert.equal(v("fluxon_dropped_total"), 0, "fluxon_dropped_total");
  assert.equal(v("fluxon_backlog"), N - CONSUMED, "fluxon_backlog");
  assert.ok(claimsWhile >= 1, "fluxon_claims while subscribed");
  const text = await bridge.metricsText();
  assert.match(text, /^# TYPE fluxon_captured_total counter$/m, "Prometheus TYPE line");
  assert.match(text, /^# TYPE fluxon_backlog gauge$/m, "Prometheus TYPE line (gauge)");
  const info = await channelInfo(nc, "orders");
  assert.equal(info.backlog, N - CONSUMED);

  // SIGHUP reloads the channel list: an added channel starts capturing.
  bridge.opts.channels = [ORDERS_CH, DEMO_CH, { name: "audit", subjects: ["audit.>"], deliver_prefix: "q.audit" }];
  await bridge.writeConfig();
  bridge.proc.signal("SIGHUP");
  const am = makeMsg("ops", 1000, "audit.login");
  const ar = await publishAll(nc, [am], { retry: true, deadline: 15_000, timeout: 3000 });
  assert.equal(ar.acked.size, 1, `publish to the channel added by SIGHUP: ${JSON.stringify([...ar.failed.values()][0])}`);
  assert.equal(ar.acked.get(am.id).stream, "audit", "PubAck stream of the added channel");
  await waitBacklog(nc, "audit", 1);
  out = await fluxonctl([...server, "channels"]);
  assert.ok(out.stdout.split("\n").some((l) => /^audit\s/.test(l)), `audit listed after SIGHUP:\n${out.stdout}`);
  assert.equal((await channelInfo(nc, "orders")).backlog, N - CONSUMED, "orders untouched by the reload");

  // /healthz: 200 ok, then 503 with an error while etcd is down, then ok again.
  let h = await bridge.health();
  assert.equal(h.status, 200);
  assert.deepEqual(h.json, { status: "ok" });
  await st.etcd.stop();
  h = await waitFor(async () => {
    const r = await httpGet(bridge.healthUrl, 2000);
    return r.status === 503 ? r : null;
  }, { timeout: 20_000, what: "/healthz 503 with etcd stopped" });
  assert.equal(h.json && h.json.status, "error", `503 body: ${h.text}`);
  assert.ok(h.json.error && h.json.error.length > 0, "503 carries an error");
  ctx.log(`healthz with etcd down: ${h.text}`);
  assert.ok(bridge.proc.running, "the bridge survives an etcd outage");
  await st.etcd.start();
  await bridge.waitHealthy(30_000);
  // After the outage the data path works again: a publish is stored and consumed.
  const em = makeMsg("ops", 2000, "orders.after-etcd");
  const er = await publishAll(nc, [em], { retry: true, deadline: 20_000, timeout: 5000 });
  assert.equal(er.acked.size, 1, `publish after etcd came back: ${JSON.stringify([...er.failed.values()][0])}`);
  await waitBacklog(nc, "orders", N - CONSUMED + 1, 10_000);
  const after = new Consumer(nc, "q.orders.after");
  await after.waitUnique(N - CONSUMED + 1, 20_000);
  await waitBacklog(nc, "orders", 0, 15_000);
  assert.ok(after.counts.has(em.id), "the message published after the outage was delivered");
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
}, { timeout: 150_000 });
