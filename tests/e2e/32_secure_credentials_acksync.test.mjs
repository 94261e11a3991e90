// Two checks on deploy/secure/ (nats-server from deploy/secure/nats-server.conf with only its
// listen addresses moved to test ports; the bridge from deploy/secure/bridge-a.json):
//
// e2e_fx_url_redacts_userinfo: passwords holding '@', ':' and '%' (lease/fx_url.h). The bridge's
// nats.url and nats.leaf_url carry them percent-encoded and connect (a publish is PubAcked,
// delivered and acked; nats.monitor_url with a raw "@" in its password is polled, so the claim
// is made); fluxonctl --server with a percent-encoded operator password works. A
// wrong password written raw ("wr@ng:pw", the userinfo ends at the last '@') in fluxonctl's
// --server and in the bridge's nats.url: neither fluxonctl's error output nor the daemon's log
// holds any part of it, and neither log holds the real passwords in any form.
//
// e2e_secure_acksync: a consumer's AckSync (npm nats ackAck(), a request to the ack reply
// subject) returns: consumer users may subscribe to their own inbox prefix (_INBOX_<name>.>,
// the client sets it as its inbox prefix), so the bridge's reply reaches alice; the message is
// not redelivered; bob cannot subscribe to alice's inbox prefix.
import fs from "node:fs";
import path from "node:path";
import { connect } from "nats";
import { setTimeout as delay } from "node:timers/promises";
import { test } from "./lib/runner.mjs";
import { Etcd, Proc, freePort, httpGet, waitFor, metricValue, Bridge, DEFAULTS, fluxonctl, bridgeRun, BRIDGE_BIN } from "./lib/stack.mjs";
import { makeMsg, Consumer, publishAll, waitClaims, waitBacklog, toJsMsg } from "./lib/client.mjs";
import { assert, assertSameSet, assertNoConsumerErrors } from "./lib/check.mjs";

const REPO = path.resolve(path.dirname(new URL(import.meta.url).pathname), "../..");
const rnd = () => Math.random().toString(36).slice(2, 10);

/** nats-server from deploy/secure/nats-server.conf; `quoted`: passwords written into the file. */
class SecureNats {
  constructor(ctx, passwords, quoted = {}) {
    this.ctx = ctx;
    this.passwords = passwords;
    this.quoted = quoted;
  }
  get url() { return `nats://127.0.0.1:${this.port}`; }
  get monitorUrl() { return `http://127.0.0.1:${this.monitorPort}`; }
  async start() {
    this.port = await freePort();
    this.monitorPort = await freePort();
    this.leafPort = await freePort();
    let conf = fs.readFileSync(path.join(REPO, "deploy/secure/nats-server.conf"), "utf8");
    const swap = (re, to) => {
      assert.match(conf, re, `deploy/secure/nats-server.conf has ${re}`);
      conf = conf.replace(re, to);
    };
    swap(/^listen: 0\.0\.0\.0:4222$/m, `listen: 127.0.0.1:${this.port}`);
    swap(/^http: 127\.0\.0\.1:8222$/m, `http: 127.0.0.1:${this.monitorPort}`);
    swap(/listen: "127\.0\.0\.1:7422"/, `listen: "127.0.0.1:${this.leafPort}"`);
    // a password with '@', ':' and '%' is written quoted (the env substitution re-lexes values)
    for (const [k, v] of Object.entries(this.quoted)) swap(new RegExp(`\\$${k}\\b`), JSON.stringify(v));
    const file = path.join(this.ctx.dir, "nats-secure.conf");
    fs.writeFileSync(file, conf);
    this.proc = new Proc(`${this.ctx.name}-nats`, "nats-server", ["-c", file], {
      logPath: path.join(this.ctx.dir, "nats.log"),
      env: { ...process.env, ...this.passwords },
    });
    this.ctx.defer(() => this.proc.stop({ timeout: 5000 }));
    this.ctx.onFailure(() => `---- nats log (last 15):\n${this.proc.logTail(15)}`);
    await waitFor(async () => {
      if (!this.proc.running) throw new Error(`nats-server exited: ${JSON.stringify(this.proc.exit)}`);
      return (await httpGet(`${this.monitorUrl}/healthz`, 1000)).status === 200;
    }, { timeout: 20_000, what: "secure nats-server /healthz" });
    return this;
  }
}

function passwords() {
  return {
    FLUXON_BRIDGE_PASSWORD: "br-" + rnd(),
    FLUXON_LEAF_PASSWORD: "lf-" + rnd(),
    FLUXON_PUBLISHER_PASSWORD: "pub-" + rnd(),
    FLUXON_ALICE_PASSWORD: "al-" + rnd(),
    FLUXON_BOB_PASSWORD: "bo-" + rnd(),
    FLUXON_OPERATOR_PASSWORD: "op-" + rnd(),
  };
}

async function login(ctx, url, user, password, extra = {}) {
  const nc = await connect({ servers: url, user, pass: password, name: `${ctx.name}-${user}`, maxReconnectAttempts: -1, reconnectTimeWait: 100, ...extra });
  nc.violations = [];
  (async () => {
    for await (const s of nc.status()) {
      if (s.type === "error" && s.data === "PERMISSIONS_VIOLATION" && s.permissionContext) nc.violations.push(s.permissionContext);
    }
  })().catch(() => {});
  ctx.defer(async () => {
    try {
      await Promise.race([nc.close(), delay(3000)]);
    } catch {
      /* closed */
    }
  });
  return nc;
}

function secureBridge(ctx, etcd, nats, nc) {
  const shipped = JSON.parse(fs.readFileSync(path.join(REPO, "deploy/secure/bridge-a.json"), "utf8"));
  return new Bridge(ctx, {
    name: shipped.name,
    nats,
    etcd,
    prefix: `/fxe2e-${ctx.name}`,
    config: (c) => {
      c.nats = { ...shipped.nats, url: nats.url, monitor_url: nats.monitorUrl, ...nc };
      c.channels = shipped.channels;
      c.defaults = { ...DEFAULTS };
    },
  });
}

test("e2e_fx_url_redacts_userinfo", async (ctx) => {
  const pw = passwords();
  const secret = { bridge: `s3cr@t:p%w-${rnd()}`, leaf: `l@f:%25-${rnd()}`, operator: `0p@r:%x-${rnd()}`, monitor: `m0n@x:y-${rnd()}` };
  const etcd = await new Etcd(ctx).start();
  const nats = await new SecureNats(ctx, pw, {
    FLUXON_BRIDGE_PASSWORD: secret.bridge, FLUXON_LEAF_PASSWORD: secret.leaf, FLUXON_OPERATOR_PASSWORD: secret.operator,
  }).start();
  const enc = encodeURIComponent;
  const host = `127.0.0.1:${nats.port}`;
  // Percent-encoded passwords in nats.url and nats.leaf_url (no nats.user / nats.password).
  const bridge = secureBridge(ctx, etcd, nats, {
    url: `nats://fluxon-bridge:${enc(secret.bridge)}@${host}`,
    user: undefined,
    password: undefined,
    leaf_url: `nats://fluxon-leaf:${enc(secret.leaf)}@127.0.0.1:${nats.leafPort}`,
    // raw '@' and ':' (the userinfo ends at the last '@'); the monitor ignores credentials, but
    // the interest poll must still reach it (libcurl reads the userinfo up to the first '@')
    monitor_url: `http://monitor:${secret.monitor}@127.0.0.1:${nats.monitorPort}`,
  });
  await bridge.writeConfig();
  const chk = await bridgeRun(["--check", "-c", bridge.configPath]);
  assert.equal(chk.code, 0, `--check: ${chk.stdout}${chk.stderr}`);
  await bridge.start();
  const pub = await login(ctx, nats.url, "publisher", pw.FLUXON_PUBLISHER_PASSWORD);
  const alice = await login(ctx, nats.url, "alice", pw.FLUXON_ALICE_PASSWORD);
  const c = new Consumer(alice, "q.orders.alice");
  await alice.flush();
  const op = await login(ctx, nats.url, "operator", secret.operator);
  await waitClaims(op, "orders", 1);
  const msgs = Array.from({ length: 20 }, (_, i) => makeMsg("cred", i, "orders.cred"));
  const res = await publishAll(pub, msgs, { concurrency: 8 });
  assert.equal(res.acked.size, msgs.length, `PubAcks ${res.acked.size}/${msgs.length}: ${JSON.stringify([...res.errCodes])}`);
  await c.waitUnique(msgs.length, 20_000);
  await waitBacklog(op, "orders", 0, 15_000);
  assertSameSet(msgs.map((m) => m.id), [...c.counts.keys()], "alice's messages");
  assertNoConsumerErrors([c]);
  ctx.log(`bridge connected with percent-encoded passwords; ${c.records.length} delivered over the leaf path`);
  assert.ok(c.records.every((r) => r.reply.startsWith("$JS.ACK.")), "deliveries came over the leaf connection");

  // fluxonctl: a percent-encoded operator password connects.
  const ok = await fluxonctl(["--server", `nats://operator:${enc(secret.operator)}@${host}`, "channels"]);
  assert.equal(ok.code, 0, `fluxonctl with a percent-encoded password: ${ok.stdout}${ok.stderr}`);
  assert.match(ok.stdout, /orders/);
  // A wrong password written raw with '@' and ':' fails, and its error shows none of it.
  const wrong = `wr@ng:pw-${rnd()}`;
  const bad = await fluxonctl(["--server", `nats://operator:${wrong}@${host}`, "channels"]);
  const out = bad.stdout + bad.stderr;
  ctx.log(`fluxonctl with a wrong raw password: exit ${bad.code}: ${out.trim()}`);
  assert.notEqual(bad.code, 0, "a wrong password is refused");
  assert.match(out, new RegExp(`\\*\\*\\*@${host.replace(/\./g, "\\.")}`), "the error names the server, credentials redacted");
  for (const frag of [wrong, wrong.slice(3), "ng:pw", "operator:"]) assert.ok(!out.includes(frag), `fluxonctl output holds ${frag}`);

  // The daemon with a wrong raw password in nats.url: its log names the server, never the password.
  const wrongB = `wr@ng:bpw-${rnd()}`;
  const cfgB = JSON.parse(fs.readFileSync(bridge.configPath, "utf8"));
  cfgB.name = "bridge-x";
  cfgB.http.listen = `127.0.0.1:${await freePort()}`;
  cfgB.nats.url = `nats://fluxon-bridge:${wrongB}@${host}`;
  delete cfgB.nats.leaf_url;
  const fileB = path.join(ctx.dir, "bridge-x.json");
  fs.writeFileSync(fileB, JSON.stringify(cfgB));
  const px = new Proc(`${ctx.name}-bridge-x`, BRIDGE_BIN, ["-c", fileB], { logPath: path.join(ctx.dir, "bridge-x.log") });
  ctx.defer(() => px.stop({ timeout: 5000 }));
  await waitFor(() => px.log().includes(host) || !px.running, { timeout: 15_000, what: "bridge-x logs the server it tries" });
  await px.stop({ timeout: 5000 });
  const logX = px.log();
  ctx.log(`bridge-x (wrong raw password): ${logX.split("\n").filter((l) => l.includes(host)).slice(0, 2).join(" | ")}`);
  for (const frag of [wrongB, wrongB.slice(3), "ng:bpw", "fluxon-bridge:"]) assert.ok(!logX.includes(frag), `bridge-x log holds ${frag}`);

  await pub.flush();
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  const log = bridge.log() + logX;
  for (const s of Object.values(secret)) {
    for (const form of [s, enc(s), s.slice(s.indexOf("@") + 1)]) assert.ok(!log.includes(form), `a password (form ${form.length} chars) in a bridge log`);
  }
  bridge.assertLogClean();
}, { timeout: 120_000 });

test("e2e_secure_acksync", async (ctx) => {
  const pw = passwords();
  const etcd = await new Etcd(ctx).start();
  const nats = await new SecureNats(ctx, pw).start();
  const bridge = secureBridge(ctx, etcd, nats, {
    password: pw.FLUXON_BRIDGE_PASSWORD,
    leaf_url: `nats://fluxon-leaf:${pw.FLUXON_LEAF_PASSWORD}@127.0.0.1:${nats.leafPort}`,
  });
  await bridge.start();
  const pub = await login(ctx, nats.url, "publisher", pw.FLUXON_PUBLISHER_PASSWORD);
  // deploy/README.md: a consumer connects with its own inbox prefix _INBOX_<name>
  const alice = await login(ctx, nats.url, "alice", pw.FLUXON_ALICE_PASSWORD, { inboxPrefix: "_INBOX_alice" });
  const bob = await login(ctx, nats.url, "bob", pw.FLUXON_BOB_PASSWORD, { inboxPrefix: "_INBOX_bob" });
  const op = await login(ctx, nats.url, "operator", pw.FLUXON_OPERATOR_PASSWORD);
  const got = [];
  alice.subscribe("q.orders.alice", { callback: (err, m) => { if (!err) got.push(m); } });
  await alice.flush();
  await waitClaims(op, "orders", 1);
  // bob cannot read alice's inbox (her AckSync replies)
  const peek = [];
  bob.subscribe("_INBOX_alice.>", { callback: (err, m) => { if (!err) peek.push(m); } });
  await bob.flush();
  await waitFor(() => bob.violations.some((v) => v.operation === "subscription" && v.subject === "_INBOX_alice.>"),
    { timeout: 5000, what: () => `bob refused on _INBOX_alice.> (${JSON.stringify(bob.violations)})` });

  const N = 5;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("acksync", i, "orders.sync"));
  const res = await publishAll(pub, msgs, { concurrency: 4 });
  assert.equal(res.acked.size, N);
  await waitFor(() => got.length >= N, { timeout: 15_000, what: `${N} deliveries to alice` });
  const took = [];
  for (const m of got.slice(0, N)) {
    const t0 = performance.now();
    const r = await toJsMsg(m, 3000).ackAck({ timeout: 3000 }).catch((e) => e);
    took.push(performance.now() - t0);
    assert.equal(r, true, `AckSync returns for alice: ${r && r.message ? r.message : r} (violations ${JSON.stringify(alice.violations)})`);
  }
  ctx.log(`${N} AckSyncs returned in ${took.map((t) => t.toFixed(1)).join(", ")} ms`);
  await waitBacklog(op, "orders", 0, 15_000);
  const ms = await bridge.metrics();
  assert.equal(metricValue(ms, "fluxon_acked_total", { channel: "orders" }), N, "every ack applied");
  await delay(300);
  assert.equal(got.length, N, "nothing redelivered after the AckSyncs");
  assert.equal(alice.violations.length, 0, `alice: no violation (${JSON.stringify(alice.violations)})`);
  assert.equal(peek.length, 0, "bob saw none of alice's replies");
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
}, { timeout: 90_000 });
