// e2e_bad_input: every class of invalid configuration exits 2 with a message naming the field
// (both with --check and on a real start), every duration form is accepted; bad arguments exit 2;
// another fatal error (HTTP address in use) exits 1; an oversized message gets a 413
// PubAck error and nothing is stored (a 1,000,000-byte one is stored and delivered intact); malformed ack replies are ignored with a metric (the bridge
// stays healthy and the message is redelivered and acked normally).
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { test } from "./lib/runner.mjs";
import { startStack, bridgeConfig, bridgeRun, freePort, waitFor, metricValue } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAcked, waitBacklog, sc } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

function variants(base) {
  const clone = () => JSON.parse(JSON.stringify(base));
  const v = [];
  const add = (name, field, edit) => {
    const c = clone();
    const text = edit(c);
    v.push({ name, field, text: typeof text === "string" ? text : JSON.stringify(c) });
  };
  add("not JSON", null, () => "{\"name\": \"x\", ");
  add("unknown top-level key", "colour", (c) => { c.colour = "blue"; });
  add("unknown nested key", "urll", (c) => { c.nats.urll = "nats://127.0.0.1:1"; });
  add("unknown channel key", "max_delivr", (c) => { c.channels[0].max_delivr = 3; });
  add("wrong type", "ttl_seconds", (c) => { c.defaults.ttl_seconds = "ninety"; });
  add("out of range", "ttl_seconds", (c) => { c.defaults.ttl_seconds = 1; });
  add("bad duration", "ack_wait", (c) => { c.defaults.ack_wait = "30 parsecs"; });
  add("bad ack mode", "ack", (c) => { c.channels[0].ack = "sometimes"; });
  add("negative max_deliver", "max_deliver", (c) => { c.channels[0].max_deliver = -1; });
  add("channel name not one token", "name", (c) => { c.channels[0].name = "or.ders"; });
  add("bridge name not one token", "name", (c) => { c.name = "a.b"; });
  add("invalid capture subject", "subjects", (c) => { c.channels[0].subjects = ["orders..x"]; });
  add("overlapping capture subjects", "subjects", (c) => {
    c.channels.push({ name: "eu", subjects: ["orders.eu.*"], deliver_prefix: "q.eu" });
  });
  add("capture overlaps a delivery prefix", "subjects", (c) => {
    c.channels.push({ name: "sneaky", subjects: ["q.>"], deliver_prefix: "q.sneaky" });
  });
  add("duplicate channel name", "name", (c) => {
    c.channels.push({ name: "orders", subjects: ["other.>"], deliver_prefix: "q.other" });
  });
  add("subjects not an array", "subjects", (c) => { c.channels[0].subjects = "orders.>"; });
  return v;
}

test("e2e_bad_input", async (ctx) => {
  const st = await startStack(ctx, { natsOpts: { maxPayload: 8 * 1024 * 1024 } });
  const base = bridgeConfig({ name: "bad", nats: st.nats, etcd: st.etcd, httpPort: await freePort(), prefix: st.prefix });

  // --version and --check on a valid config
  const ver = await bridgeRun(["--version"]);
  assert.equal(ver.code, 0, `--version exit ${ver.code}: ${ver.stderr}`);
  assert.ok((ver.stdout + ver.stderr).trim().length > 0, "--version prints something");
  const good = path.join(ctx.dir, "good.json");
  fs.writeFileSync(good, JSON.stringify(base));
  const ok = await bridgeRun(["--check", "-c", good]);
  assert.equal(ok.code, 0, `--check on a valid config: exit ${ok.code}: ${ok.stderr}`);

  // every duration form of the contract is accepted: "250ms", "30s", "5m" or a number of seconds
  const durs = JSON.parse(JSON.stringify(base));
  Object.assign(durs.defaults, { ack_wait: 30, release_after: "250ms", interest_poll: "1s" });
  durs.channels[0].ack_wait = "5m";
  durs.channels[0].backoff = ["250ms", 2, "1m"];
  fs.writeFileSync(path.join(ctx.dir, "durations.json"), JSON.stringify(durs));
  const okd = await bridgeRun(["--check", "-c", path.join(ctx.dir, "durations.json")], 5000);
  assert.equal(okd.code, 0, `durations 30, "250ms", "1s", "5m", "1m": exit ${okd.code}: ${okd.stderr}`);

  // any other fatal error exits 1: the HTTP listen address is taken
  const busy = net.createServer();
  await new Promise((r) => busy.listen(0, "127.0.0.1", r));
  ctx.defer(() => new Promise((r) => busy.close(r)));
  const taken = JSON.parse(JSON.stringify(base));
  taken.http.listen = `127.0.0.1:${busy.address().port}`;
  fs.writeFileSync(path.join(ctx.dir, "taken.json"), JSON.stringify(taken));
  const rt = await bridgeRun(["-c", path.join(ctx.dir, "taken.json")], 15_000);
  assert.equal(rt.code, 1, `http.listen in use: exit ${rt.code}${rt.timedOut ? " (timed out)" : ""}, want 1: ${rt.stderr.slice(-300)}`);
  assert.match(rt.stderr, new RegExp(`${busy.address().port}`), "the message names the address");

  // bad arguments
  for (const args of [["--no-such-flag"], ["-c"]]) {
    const r = await bridgeRun(args, 5000);
    assert.equal(r.code, 2, `args ${JSON.stringify(args)}: exit ${r.code}${r.timedOut ? " (timed out)" : ""} (want 2): ${r.stderr.slice(0, 200)}`);
  }

  // each class of config error, with --check and on a real start
  const problems = [];
  for (const [i, vr] of variants(base).entries()) {
    const file = path.join(ctx.dir, `bad-${i}.json`);
    fs.writeFileSync(file, vr.text);
    for (const args of [["--check", "-c", file], ["-c", file]]) {
      // a valid-looking but invalid config must be refused before anything starts: 5 s is ample
      const r = await bridgeRun(args, 5000);
      const out = (r.stderr + r.stdout).trim();
      if (r.timedOut) problems.push(`${vr.name} (${args.join(" ")}): still running after 5 s (killed); want exit 2`);
      else if (r.code !== 2) problems.push(`${vr.name} (${args.join(" ")}): exit ${r.code}, want 2; output: ${out.slice(0, 200)}`);
      else if (!out) problems.push(`${vr.name}: exit 2 without a message`);
      else if (vr.field && !out.includes(vr.field)) problems.push(`${vr.name}: message does not name "${vr.field}": ${out.slice(0, 200)}`);
    }
    if (i === 0) ctx.log(`example message: ${(await bridgeRun(["--check", "-c", file])).stderr.trim().slice(0, 160)}`);
  }
  assert.equal(problems.length, 0, `config errors:\n    ${problems.join("\n    ")}`);

  // A running bridge: oversized message and malformed acks.
  const bridge = await st.bridge({ name: "bad", defaults: { ack_wait: "1s", backoff: ["100ms"] } }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const big = makeMsg("bad", 1, "orders.big");
  const huge = new Uint8Array(7 * 1024 * 1024);
  huge.set(big.data);
  huge[big.data.length] = 0x0a;
  const r = await publishAcked(nc, { ...big, data: huge }, 20_000);
  assert.equal(r.ok, false, `oversized publish was accepted: ${JSON.stringify(r.ack)}`);
  assert.equal(r.code, 413, `oversized publish: ${JSON.stringify(r)}`);
  assert.ok(typeof r.error === "string" && r.error.length > 0, "error description");
  assert.ok(bridge.proc.running, "bridge alive after the oversized message");

  // Just over 1 MiB (more than a default nats-server can deliver): 413 as well.
  const r1 = await publishAcked(nc, { ...big, data: huge.subarray(0, (1 << 20) + 1) }, 20_000);
  assert.equal(r1.code, 413, `1 MiB + 1 publish: ${JSON.stringify(r1)}`);
  // A large message below the limit (1,000,000 bytes) is stored and delivered intact.
  const large = makeMsg("bad", 3, "orders.large");
  const ldata = new Uint8Array(1_000_000);
  for (let i = 0; i < ldata.length; i++) ldata[i] = (i * 7 + 3) & 0xff;
  const rl = await publishAcked(nc, { ...large, data: ldata }, 20_000);
  assert.ok(rl.ok, `1,000,000-byte publish: ${JSON.stringify(rl)}`);
  const lc = new Consumer(nc, "q.orders.large", { ackMode: (m) => {
    lc.raw = m.data;
    return "+ACK";
  } });
  await waitFor(() => lc.raw, { timeout: 20_000, what: "the large message" });
  assert.ok(Buffer.from(lc.raw).equals(Buffer.from(ldata)), "large payload intact");
  await waitBacklog(nc, "orders", 0);
  await lc.unsubscribe();

  // malformed acks
  let forged = false;
  const c = new Consumer(nc, "q.orders.c", {
    // The first delivery to this claim (its count may already be 2: the message can first go
    // to the "large" claim, whose subscriber just left, and that attempt counts).
    ackMode: (m, rec) => {
      if (c.records.length === 1) {
        if (!forged) {
          forged = true;
          // forged ack subjects: wrong shape and an unknown delivery (bad nonce)
          const t = m.reply.split(".");
          nc.publish(`${t.slice(0, 6).join(".")}.x`, sc.encode("+ACK"));
          t[11] = "12345";
          nc.publish(t.join("."), sc.encode("+ACK"));
          nc.publish(m.reply, sc.encode("+NOPE"));
        }
        return "ack, please"; // malformed body
      }
      return "+ACK";
    },
  });
  const small = makeMsg("bad", 2, "orders.small");
  const r2 = await publishAcked(nc, small);
  assert.ok(r2.ok, `normal publish after the oversized one: ${JSON.stringify(r2)}`);
  // the malformed ack is ignored: the message comes back (ack_wait 1 s) and is then acked
  await waitFor(() => c.records.length >= 2, { timeout: 15_000, what: "redelivery after a malformed ack" });
  assert.equal(c.records[1].delivered, c.records[0].delivered + 1, "the malformed ack did not count as an ack");
  await waitBacklog(nc, "orders", 0, 15_000);
  assert.deepEqual([...c.counts.keys()], [small.id], "only the normal message was stored and delivered");
  assert.ok(bridge.proc.running, "bridge alive after malformed acks");
  const h = await bridge.health();
  assert.equal(h.status, 200);
  const text = await bridge.metricsText();
  const series = text.split("\n").filter((l) => !l.startsWith("#") && /ack/i.test(l) && /(invalid|malformed|bad|unknown|ignored)/i.test(l));
  ctx.log(`malformed-ack metrics: ${series.join(" | ")}`);
  const total = series.reduce((s, l) => s + Number(l.trim().split(/\s+/).pop()), 0);
  assert.ok(total >= 2, `a metric counts malformed acks (found: ${series.join(" | ") || "none"})`);
  const ms = await bridge.metrics();
  ctx.log(`captured ${metricValue(ms, "fluxon_captured_total", { channel: "orders" })}, dropped ${metricValue(ms, "fluxon_dropped_total", { channel: "orders" })}`);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
}, { timeout: 150_000 });
