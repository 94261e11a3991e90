// e2e_schedule_header_compat: JetStream's "Nats-Schedule: @at <RFC 3339>" header from nats.go
// (js.PublishMsg) and from the npm client (js.publish with headers), 50 each on ONE subject
// (JetStream allows one schedule per subject; here any number): each is PubAcked and arrives
// not before its time and within 1 s after it. Malformed schedules, the schedule forms the bridge
// does not support (cron, @every), a time above the channel's max_delay and two delay headers
// get a 400-class PubAck error with a clear description, and nothing of them is stored: no key
// in the delay index, no delivery (observation window), fluxon_delayed_refused_total counts them.
import { test } from "./lib/runner.mjs";
import { startStack, runCmd, waitFor, SLOW } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, natsHeaders, waitBacklog } from "./lib/client.mjs";
import { assert, assertNoConsumerErrors, assertNoDuplicates } from "./lib/check.mjs";
import { buildGo } from "./14_go_client_compat.test.mjs";

const TRUNC_MS = 2;
const LATE_MS = 1000 * SLOW;
const N = 50;

async function etcdCount(st, prefix) {
  const b64 = (s) => Buffer.from(s).toString("base64");
  const end = Buffer.from(prefix);
  end[end.length - 1] += 1;
  const r = await fetch(`${st.etcd.url}/v3/kv/range`, { method: "POST", body: JSON.stringify({ key: b64(prefix), range_end: end.toString("base64"), count_only: true }), signal: AbortSignal.timeout(5000) });
  return Number((await r.json()).count || 0);
}

test("e2e_schedule_header_compat", async (ctx) => {
  const bin = await buildGo("schedule");
  const st = await startStack(ctx);
  const orders = { name: "orders", subjects: ["orders.>"], deliver_prefix: "q.orders", max_delay: "1h" };
  const bridge = await st.bridge({ name: "sch", channels: [orders], defaults: { ack_wait: "60s" } }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const c = new Consumer(nc, "q.orders.w");
  await nc.flush();
  const js = nc.jetstream();

  // npm client: 50 on orders.npm, @at spread over 1-3 s, then the refused forms
  const due = new Map();
  const npmPubs = [];
  for (let i = 0; i < N; i++) {
    const m = makeMsg("npm", i, "orders.npm");
    const at = Date.now() + 1000 + Math.floor((i * 2000) / N);
    m.headers.set("Nats-Schedule", `@at ${new Date(at).toISOString()}`);
    due.set(m.id, at);
    npmPubs.push(js.publish(m.subject, m.data, { headers: m.headers }).then((pa) => {
      assert.equal(pa.stream, "orders", `npm PubAck of ${m.id}`);
    }));
  }
  await Promise.all(npmPubs);
  const refusedNpm = [];
  const bad = [
    ["Nats-Schedule", "@at soon", /malformed/],
    ["Nats-Schedule", "@every 5s", /not supported/],
    ["Nats-Schedule", "*/5 * * * * *", /not supported/],
    ["Nats-Schedule", `@at ${new Date(Date.now() + 2 * 3600_000).toISOString()}`, /max_delay \(1h\)/],
    ["Fluxon-Delay", "soon", /malformed/],
    ["Fluxon-Delay", "3h", /max_delay \(1h\)/],
    ["both", "", /at most one/],
  ];
  for (const [i, [k, v, re]] of bad.entries()) {
    const m = makeMsg("npm-bad", i, "orders.npm");
    if (k === "both") {
      m.headers.set("Fluxon-Delay", "5s");
      m.headers.set("Nats-Schedule", `@at ${new Date(Date.now() + 5000).toISOString()}`);
    } else {
      m.headers.set(k, v);
    }
    const err = await js.publish(m.subject, m.data, { headers: m.headers }).then(() => null, (e) => e);
    assert.ok(err, `npm: ${k}: ${v} refused`);
    const api = err.api_error || {};
    ctx.log(`npm: ${k}: ${v} -> ${err.message} (code ${api.code})`);
    assert.equal(api.code, 400, `npm: ${k}: ${v}: code 400 (${JSON.stringify(api)})`);
    assert.match(api.description || err.message, re, `npm: ${k}: ${v}: description`);
    refusedNpm.push(m.id);
  }

  // nats.go: 50 on orders.go with @at (RFC3339Nano), then its refused forms
  const r = await runCmd(bin, ["-url", st.nats.url, "-subject", "orders.go", "-n", String(N), "-first", "1000", "-spread", "2000", "-too-far", "2h"], { timeout: 60_000 * SLOW });
  assert.equal(r.code, 0, `go program exit ${r.code}: ${r.stderr}`);
  const goRes = r.stdout.split("\n").filter(Boolean).map((l) => JSON.parse(l));
  const refusedGo = [];
  for (const g of goRes) {
    if (g.id.startsWith("go-bad")) {
      ctx.log(`nats.go: ${g.hdr} -> ${g.err} (code ${g.code})`);
      assert.ok(!g.ok, `nats.go: ${g.hdr} refused`);
      assert.equal(g.code, 400, `nats.go: ${g.hdr}: APIError code 400`);
      refusedGo.push(g.id);
    } else {
      assert.ok(g.ok, `nats.go publish ${g.id}: ${g.err}`);
      due.set(g.id, g.due_ms);
    }
  }
  assert.equal(refusedGo.length, 5);
  assert.match(goRes.find((g) => g.id === "go-bad-4").err, /max_delay/);

  await c.waitUnique(2 * N, 20_000 * SLOW);
  let early = 0, late = 0, worst = 0;
  for (const rec of c.records) {
    const d = due.get(rec.id);
    assert.ok(d !== undefined, `unexpected delivery ${rec.id}`);
    if (rec.at < d - TRUNC_MS) early++;
    if (rec.at > d + LATE_MS) late++;
    worst = Math.max(worst, rec.at - d);
  }
  ctx.log(`${c.records.length} scheduled deliveries on 2 subjects: early ${early}, late ${late}, latest ${worst} ms after due`);
  assert.equal(early, 0, "no scheduled message before its time");
  assert.equal(late, 0, `every scheduled message within ${LATE_MS} ms of its time`);
  // nothing of the refused ones: not in the index, never delivered (observation window 1.5 s)
  assert.equal(await etcdCount(st, `${st.prefix}/delay/orders/`), 0, "delay index empty");
  await new Promise((res) => setTimeout(res, 1500));
  c.check();
  for (const id of [...refusedNpm, ...refusedGo]) assert.ok(!c.counts.has(id), `refused ${id} never delivered`);
  assert.equal(c.unique, 2 * N);
  const text = await bridge.metricsText();
  const refused = Number((text.match(/^fluxon_delayed_refused_total\{channel="orders"\} (\d+)/m) || [])[1]);
  assert.equal(refused, refusedNpm.length + refusedGo.length, "fluxon_delayed_refused_total");
  assertNoDuplicates([c]);
  assertNoConsumerErrors([c]);
  await waitBacklog(nc, "orders", 0, 15_000 * SLOW);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
});
