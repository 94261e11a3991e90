// e2e_secure_deploy_permissions: nats-server runs from deploy/secure/nats-server.conf (only the
// three listen addresses moved to test ports; passwords from the environment, as deployed) and
// the bridge from deploy/secure/bridge-a.json (endpoints and passwords filled in), its client and
// its leaf connection both authenticated. The publisher publishes and gets PubAcks; alice
// receives and acks every message; bob, logged in as himself, is refused by the server (a
// permissions violation each) when he subscribes to q.orders.alice or q.orders.>, publishes to
// alice's ack subjects (both forms) or publishes a fake delivery to q.orders.alice; alice still
// gets every message exactly once, and bob none of them.
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { connect } from "nats";
import { setTimeout as delay } from "node:timers/promises";
import { test } from "./lib/runner.mjs";
import { Etcd, Proc, freePort, httpGet, waitFor, metricValue, Bridge, DEFAULTS } from "./lib/stack.mjs";
import { makeMsg, Consumer, publishAll, waitClaims, waitBacklog, sc } from "./lib/client.mjs";
import { assert, assertSameSet, assertNoDuplicates, assertNoConsumerErrors } from "./lib/check.mjs";

const REPO = path.resolve(path.dirname(new URL(import.meta.url).pathname), "../..");
const PASSWORDS = {
  FLUXON_BRIDGE_PASSWORD: "br-" + Math.random().toString(36).slice(2),
  FLUXON_LEAF_PASSWORD: "lf-" + Math.random().toString(36).slice(2),
  FLUXON_PUBLISHER_PASSWORD: "pub-" + Math.random().toString(36).slice(2),
  FLUXON_ALICE_PASSWORD: "al-" + Math.random().toString(36).slice(2),
  FLUXON_BOB_PASSWORD: "bo-" + Math.random().toString(36).slice(2),
  FLUXON_OPERATOR_PASSWORD: "op-" + Math.random().toString(36).slice(2),
};

class SecureNats {
  constructor(ctx) {
    this.ctx = ctx;
  }
  get url() { return `nats://127.0.0.1:${this.port}`; }
  get monitorUrl() { return `http://127.0.0.1:${this.monitorPort}`; }
  get leafUrl() { return `nats://127.0.0.1:${this.leafPort}`; }
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
    const file = path.join(this.ctx.dir, "nats-secure.conf");
    fs.writeFileSync(file, conf);
    this.proc = new Proc(`${this.ctx.name}-nats`, "nats-server", ["-c", file], {
      logPath: path.join(this.ctx.dir, "nats.log"),
      env: { ...process.env, ...PASSWORDS },
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

/** Connect as user; records the permission violations the server reports on this connection. */
async function login(ctx, url, user, password) {
  const nc = await connect({ servers: url, user, pass: password, name: `${ctx.name}-${user}`, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
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

async function refused(nc, operation, subject) {
  await waitFor(() => nc.violations.some((v) => v.operation === operation && v.subject === subject),
    { timeout: 5000, what: () => `the server refuses ${operation} to ${subject} (violations: ${JSON.stringify(nc.violations)})` });
}

/**
 * A leaf connection without credentials that tries to deliver a fake message to alice (leafnode
 * protocol LMSG). nats-server binds it to the global account "$G", which holds no user of this
 * deployment: it reaches nobody. Returns the server's protocol lines.
 */
function anonymousLeafDelivery(port) {
  return new Promise((resolve) => {
    const s = net.connect(port, "127.0.0.1");
    let buf = "";
    let sent = false;
    const done = (v) => { s.destroy(); resolve(v); };
    s.setTimeout(5000, () => done(buf + "\n(timeout)"));
    s.on("error", (e) => done(buf + String(e)));
    s.on("close", () => done(buf));
    s.on("data", (d) => {
      buf += d.toString();
      if (buf.includes("INFO") && !sent) {
        sent = true;
        s.write('CONNECT {"verbose":false,"pedantic":false,"name":"anon"}\r\nLMSG q.orders.alice 4\r\nfake\r\nPING\r\n');
      }
      if (/-ERR|PONG/.test(buf)) done(buf);
    });
  });
}

test("e2e_secure_deploy_permissions", async (ctx) => {
  const etcd = await new Etcd(ctx).start();
  const nats = await new SecureNats(ctx).start();
  const shipped = JSON.parse(fs.readFileSync(path.join(REPO, "deploy/secure/bridge-a.json"), "utf8"));
  const bridge = new Bridge(ctx, {
    name: shipped.name,
    nats,
    etcd,
    prefix: `/fxe2e-${ctx.name}`,
    config: (c) => {
      const leaf = new URL(shipped.nats.leaf_url);
      assert.equal(decodeURIComponent(leaf.username), "fluxon-leaf", "the shipped leaf URL logs in as fluxon-leaf");
      c.nats = {
        ...shipped.nats,
        url: nats.url,
        monitor_url: nats.monitorUrl,
        password: PASSWORDS.FLUXON_BRIDGE_PASSWORD,
        leaf_url: `nats://fluxon-leaf:${PASSWORDS.FLUXON_LEAF_PASSWORD}@127.0.0.1:${nats.leafPort}`,
      };
      c.channels = shipped.channels;
      c.defaults = { ...DEFAULTS };
    },
  });
  await bridge.start();
  const pub = await login(ctx, nats.url, "publisher", PASSWORDS.FLUXON_PUBLISHER_PASSWORD);
  const alice = await login(ctx, nats.url, "alice", PASSWORDS.FLUXON_ALICE_PASSWORD);
  const bob = await login(ctx, nats.url, "bob", PASSWORDS.FLUXON_BOB_PASSWORD);
  const op = await login(ctx, nats.url, "operator", PASSWORDS.FLUXON_OPERATOR_PASSWORD);

  const c = new Consumer(alice, "q.orders.alice");
  await alice.flush();
  await waitClaims(op, "orders", 1); // the operator reads the admin API

  // A leaf connection without the leaf user's credentials lands outside the FLUXON account: its
  // fake delivery never reaches alice (a record with a body that is not a test message would fail
  // assertNoConsumerErrors below).
  const anon = await anonymousLeafDelivery(nats.leafPort);
  assert.ok(/PONG|-ERR/.test(anon), `anonymous leaf: ${anon.slice(-200)}`);

  // bob tries to take alice's deliveries: both subscriptions are refused by the server.
  const stolen = [];
  bob.subscribe("q.orders.alice", { callback: (err, m) => { if (!err) stolen.push(m); } });
  bob.subscribe("q.orders.>", { callback: (err, m) => { if (!err) stolen.push(m); } });
  await bob.flush();
  await refused(bob, "subscription", "q.orders.alice");
  await refused(bob, "subscription", "q.orders.>");

  const N = 100;
  const msgs = Array.from({ length: N }, (_, i) => makeMsg("sec", i, `orders.sec${i % 3}`));
  const sending = publishAll(pub, msgs, { concurrency: 16 });
  // meanwhile bob forges alice's acks (+TERM would dead-letter her messages) and a delivery
  const ackForms = [];
  for (let i = 1; i <= 20; i++) {
    ackForms.push(`$JS.ACK.FLUXON.bridge-a.orders.alice.1.${i}.${i}.1700000000000000000.0.${1000 + i}`);
    ackForms.push(`$FLUXON.ACK.FLUXON.bridge-a.orders.alice.1.${i}.${i}.1700000000000000000.0.${1000 + i}`);
  }
  for (const s of ackForms) bob.publish(s, sc.encode("+TERM"));
  bob.publish("q.orders.alice", sc.encode("a fake delivery"));
  await bob.flush();
  await refused(bob, "publish", ackForms[0]);
  await refused(bob, "publish", ackForms[1]);
  await refused(bob, "publish", "q.orders.alice");

  const res = await sending;
  assert.equal(res.acked.size, N, `PubAcks: ${res.acked.size}/${N}, errors ${JSON.stringify([...res.errCodes])}`);
  assert.ok([...res.acked.values()].every((a) => a.stream === "orders"), "PubAcks name the channel");
  await c.waitUnique(N, 20_000);
  await waitBacklog(op, "orders", 0, 15_000);
  const ms = await bridge.metrics();
  assert.equal(metricValue(ms, "fluxon_acked_total", { channel: "orders" }), N, "alice's acks all counted");
  assert.equal(metricValue(ms, "fluxon_dead_lettered_total", { channel: "orders" }) || 0, 0, "nothing dead-lettered by bob");
  assertSameSet(msgs.map((m) => m.id), [...c.counts.keys()], "alice's messages");
  assertNoDuplicates([c], "alice's deliveries");
  assert.equal(c.records.length, N, "each delivered exactly once");
  assert.ok(c.records.every((r) => r.delivered === 1 && r.reply.startsWith("$JS.ACK.FLUXON.bridge-a.orders.alice.")), "first attempts, leaf-path ack subjects");
  assert.equal(stolen.length, 0, "bob received nothing");
  assert.equal(alice.violations.length, 0, `alice: no violation (${JSON.stringify(alice.violations)})`);
  assert.equal(pub.violations.length, 0, `publisher: no violation (${JSON.stringify(pub.violations)})`);
  assertNoConsumerErrors([c]);
  const log = bridge.log();
  for (const p of Object.values(PASSWORDS)) assert.ok(!log.includes(p), "no password in the bridge log");
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
});
