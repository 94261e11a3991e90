// Faults in the cluster shape: three routed nats-servers A, B, C, one etcd, bridge L
// beside A and bridge R beside B; the subscriber and the publisher are connected to C (no bridge
// beside it). Under load (acked publishes, each retried until acked), with the consumer present:
//  e2e_cluster_bridge_kill9:   L is killed with SIGKILL part-way; R takes over its claim's backlog.
//  e2e_cluster_etcd_leader_loss: three etcd members (the bridges list all three); the leader is
//                              killed (SIGKILL) part-way; the other two keep quorum.
//  e2e_cluster_nats_node_loss: nats-server B (R's server) is killed (SIGKILL) part-way and started
//                              again.
//  e2e_cluster_bridge_partitioned_from_etcd: L is cut from etcd (TCP proxy) for ttl_seconds + 3 s;
//                              fencing checked by each delivery's origin (bridge, sub-MPSC, time)
//                              and duplicates bounded by what was in flight (see the test).
// Counts reported: published, acked, delivered, duplicated, lost; 0 acked lost in each.
import { test } from "./lib/runner.mjs";
import { Etcd, Bridge, startNatsCluster, startEtcdCluster, etcdLeader, waitFor, metricValue, SLOW } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll } from "./lib/client.mjs";
import { assert, assertCovers, assertNoConsumerErrors } from "./lib/check.mjs";

const DEFAULTS = { ttl_seconds: 3, ack_wait: "5s", release_after: "1s", interest_poll: "200ms" };

async function clusterStack(ctx, { etcdMembers = 1 } = {}) {
  const etcdStart = etcdMembers > 1 ? startEtcdCluster(ctx, etcdMembers) : new Etcd(ctx).start().then((e) => [e]);
  const [[A, B, C], etcds] = await Promise.all([startNatsCluster(ctx, 3), etcdStart]);
  const etcd = etcds[0];
  const urls = etcds.map((e) => e.url);
  const config = (cfg) => {
    cfg.etcd.endpoints = urls;
    cfg.kv.endpoints = urls;
  };
  const prefix = `/fxe2e-${ctx.name}`;
  const L = new Bridge(ctx, { name: "L", nats: A, etcd, prefix, defaults: DEFAULTS, config });
  const R = new Bridge(ctx, { name: "R", nats: B, etcd, prefix, defaults: DEFAULTS, config });
  await Promise.all([L.start(), R.start()]);
  const subNc = await natsConnect(ctx, C.url, "sub-on-C");
  const sub = new Consumer(subNc, "q.orders.f");
  await subNc.flush();
  const claimsOf = async (br) => metricValue(await br.metrics(), "fluxon_claims", { channel: "orders" }) || 0;
  let g = [0, 0];
  await waitFor(async () => {
    g = [await claimsOf(L), await claimsOf(R)];
    return g[0] >= 1 && g[1] >= 1;
  }, { timeout: 10_000, what: () => `both bridges claim for the subscriber on C (L ${g[0]}, R ${g[1]})` });
  const pubNc = await natsConnect(ctx, C.url, "pub-on-C");
  return { A, B, C, L, R, sub, pubNc, etcds };
}

async function runUnderFault(ctx, s, { n, faultAt, fault, tag }) {
  const msgs = Array.from({ length: n }, (_, i) => makeMsg(tag, i, `orders.f${i % 4}`));
  let faulted = null;
  const res = await publishAll(s.pubNc, msgs, {
    concurrency: 128,
    retry: true,
    deadline: 90_000,
    timeout: 5000,
    onAck: (m, ack, count) => {
      if (count === faultAt && !faulted) faulted = fault();
    },
  });
  assert.ok(faulted, "the fault happened during the stream");
  await faulted;
  assert.equal(res.failed.size, 0, `not acked in the end: ${res.failed.size}; errors ${JSON.stringify([...res.errCodes])}`);
  const acked = [...res.acked.keys()];
  const have = (id) => s.sub.counts.has(id);
  await waitFor(() => (s.sub.check(), acked.every(have)), { timeout: 45_000, interval: 100, what: () => `every acked message at the subscriber on C (have ${acked.filter(have).length}/${acked.length})` });
  assertNoConsumerErrors([s.sub]);
  assertCovers(acked, [...s.sub.counts.keys()], "acked messages at C");
  const attempts = [...res.attempts.values()].reduce((a, b) => a + b, 0);
  ctx.log(`${tag}: published ${attempts} (${n} distinct), acked ${acked.length}, delivered ${s.sub.unique} distinct, duplicated ${s.sub.duplicates().length}, lost ${acked.filter((id) => !have(id)).length}`);
  return res;
}

test("e2e_cluster_bridge_kill9", async (ctx) => {
  const s = await clusterStack(ctx);
  await runUnderFault(ctx, s, {
    n: 3000,
    faultAt: 1000,
    tag: "K",
    fault: async () => {
      const ex = await s.L.kill9();
      ctx.log(`SIGKILL to bridge L (exit ${JSON.stringify(ex)}); delivered so far ${s.sub.unique}`);
    },
  });
  const ex = await s.R.stop();
  assert.equal(ex.code, 0, `R exit ${JSON.stringify(ex)}`);
}, { timeout: 150_000 });

test("e2e_cluster_etcd_leader_loss", async (ctx) => {
  const s = await clusterStack(ctx, { etcdMembers: 3 });
  await runUnderFault(ctx, s, {
    n: 3000,
    faultAt: 1000,
    tag: "E",
    fault: async () => {
      const leader = await etcdLeader(s.etcds);
      assert.ok(leader, "an etcd leader");
      const ex = await leader.proc.kill9();
      ctx.log(`SIGKILL to the etcd leader ${leader.name} (exit ${JSON.stringify(ex)}); delivered so far ${s.sub.unique}`);
      const next = await waitFor(async () => etcdLeader(s.etcds), { timeout: 15_000, what: "a new etcd leader" });
      ctx.log(`new etcd leader: ${next.name}`);
    },
  });
  for (const br of [s.L, s.R]) {
    const ex = await br.stop();
    assert.equal(ex.code, 0, `${br.name} exit ${JSON.stringify(ex)}`);
  }
}, { timeout: 150_000 });

test("e2e_cluster_nats_node_loss", async (ctx) => {
  const s = await clusterStack(ctx);
  await runUnderFault(ctx, s, {
    n: 3000,
    faultAt: 1000,
    tag: "N",
    fault: async () => {
      const ex = await s.B.proc.kill9();
      ctx.log(`SIGKILL to nats-server B (bridge R's server; exit ${JSON.stringify(ex)}); delivered so far ${s.sub.unique}`);
      await s.B.start();
      ctx.log("nats-server B started again");
      await s.R.waitHealthy(30_000);
      ctx.log("bridge R healthy again");
    },
  });
  for (const br of [s.L, s.R]) {
    const ex = await br.stop();
    assert.equal(ex.code, 0, `${br.name} exit ${JSON.stringify(ex)}`);
  }
}, { timeout: 150_000 });

// A TCP proxy between one bridge and etcd: cut() closes every connection and refuses new ones
// until restore().
import net from "node:net";
class TcpProxy {
  constructor(ctx, targetPort) {
    this.ctx = ctx;
    this.targetPort = targetPort;
    this.sockets = new Set();
    this.isCut = false;
  }
  async start() {
    this.server = net.createServer((client) => {
      if (this.isCut) {
        client.destroy();
        return;
      }
      const up = net.connect(this.targetPort, "127.0.0.1");
      for (const s of [client, up]) {
        this.sockets.add(s);
        s.on("close", () => this.sockets.delete(s));
        s.on("error", () => {});
      }
      client.pipe(up);
      up.pipe(client);
      client.on("close", () => up.destroy());
      up.on("close", () => client.destroy());
    });
    await new Promise((res) => this.server.listen(0, "127.0.0.1", res));
    this.ctx.defer(() => new Promise((res) => {
      for (const s of this.sockets) s.destroy();
      this.server.close(() => res());
    }));
    return this;
  }
  get url() {
    return `http://127.0.0.1:${this.server.address().port}`;
  }
  cut() {
    this.isCut = true;
    for (const s of this.sockets) s.destroy();
  }
  restore() {
    this.isCut = false;
  }
}

/** The bridge that made a delivery: the token after "FLUXON" in its ack reply subject
 * ($JS.ACK.FLUXON.<bridge>.… on the leaf path, $FLUXON.ACK.FLUXON.<bridge>.… otherwise). */
function originOf(rec) {
  const t = rec.reply.split(".");
  const k = t.indexOf("FLUXON", 2);
  return k >= 0 ? t[k + 1] : "?";
}
/** The sub-MPSC a delivery came from: the first field of Fluxon-Id (<chan>.<producer>.<msg>). */
function chanOf(rec) {
  const v = rec.headers ? rec.headers.get("Fluxon-Id") : "";
  return v ? v.split(".")[0] : "?";
}

test("e2e_cluster_bridge_partitioned_from_etcd", async (ctx) => {
  const etcd = new Etcd(ctx);
  const [[A, B, C]] = await Promise.all([startNatsCluster(ctx, 3), etcd.start()]);
  const proxy = await new TcpProxy(ctx, etcd.clientPort).start();
  const prefix = `/fxe2e-${ctx.name}`;
  const viaProxy = (cfg) => {
    cfg.etcd.endpoints = [proxy.url];
    cfg.kv.endpoints = [proxy.url];
  };
  const L = new Bridge(ctx, { name: "L", nats: A, etcd, prefix, defaults: DEFAULTS, config: viaProxy });
  const R = new Bridge(ctx, { name: "R", nats: B, etcd, prefix, defaults: DEFAULTS });
  await Promise.all([L.start(), R.start()]);
  const subNc = await natsConnect(ctx, C.url, "sub-on-C");
  const sub = new Consumer(subNc, "q.orders.f");
  await subNc.flush();
  const claimsOf = async (br) => metricValue(await br.metrics(), "fluxon_claims", { channel: "orders" }) || 0;
  let g = [0, 0];
  await waitFor(async () => {
    g = [await claimsOf(L), await claimsOf(R)];
    return g[0] >= 1 && g[1] >= 1;
  }, { timeout: 10_000, what: () => `both bridges claim for the subscriber on C (L ${g[0]}, R ${g[1]})` });
  const pubNc = await natsConnect(ctx, C.url, "pub-on-C");
  const CUT_MS = DEFAULTS.ttl_seconds * 1000 + 3000; // longer than ttl_seconds
  const logFrom = L.log().length;
  let tCut = 0;
  let tRestore = 0;
  const res = await runUnderFault(ctx, { sub, pubNc }, {
    n: 3000,
    faultAt: 800,
    tag: "P",
    fault: async () => {
      // L's claim must be delivering before it is cut off (else there is nothing to fence).
      await waitFor(() => sub.records.some((r) => originOf(r) === "L"), { timeout: 30_000, interval: 20, what: "a delivery from bridge L before the cut" });
      proxy.cut();
      tCut = Date.now();
      ctx.log(`bridge L cut off from etcd for ${CUT_MS} ms; delivered so far ${sub.unique}`);
      await waitFor(() => Date.now() - tCut >= CUT_MS, { timeout: CUT_MS + 1000, interval: 100, what: "the partition's length" });
      proxy.restore();
      tRestore = Date.now();
      ctx.log("bridge L reconnected to etcd");
    },
  });
  // Fencing, from the deliveries themselves: each record's origin bridge (ack reply subject),
  // sub-MPSC (Fluxon-Id) and arrival time. L's lost claim = the sub-MPSCs L delivered from before
  // the cut. L's member lease was last confirmed before the cut, so from tCut + ttl_seconds on
  // (etcd may have expired it and R may drain those sub-MPSCs) L must hand out nothing from them;
  // GRACE covers deliveries already on their way. A delivery by L from a lost sub-MPSC after
  // that is stale when it comes while L is still cut off, or when R delivered the same id too
  // (after the partition L may legitimately bind one of them again with a new claim and deliver
  // messages R never saw).
  const GRACE_MS = 1000 * SLOW;
  const tFence = tCut + DEFAULTS.ttl_seconds * 1000 + GRACE_MS;
  const recs = sub.records.map((r) => ({ id: r.id, at: r.at, br: originOf(r), chan: chanOf(r), dl: r.delivered }));
  const rel = (t) => `${t >= tCut ? "+" : ""}${t - tCut} ms`;
  const lostChans = new Set(recs.filter((r) => r.br === "L" && r.at < tCut).map((r) => r.chan));
  assert.ok(lostChans.size > 0, "bridge L delivered from its claim before the cut (positive control)");
  assert.ok(recs.every((r) => r.br === "L" || r.br === "R"), `every delivery names its bridge: ${JSON.stringify(recs.find((r) => r.br !== "L" && r.br !== "R"))}`);
  const byId = new Map();
  for (const r of recs) {
    if (!byId.has(r.id)) byId.set(r.id, []);
    byId.get(r.id).push(r);
  }
  const rHas = (id) => byId.get(id).some((x) => x.br === "R");
  const lLost = recs.filter((r) => r.br === "L" && lostChans.has(r.chan));
  const lastBeforeFence = Math.max(...lLost.filter((r) => r.at <= tFence).map((r) => r.at));
  const stale = lLost.filter((r) => r.at > tFence && (r.at < tRestore || rHas(r.id)));
  const takeover = recs.filter((r) => r.br === "R" && lostChans.has(r.chan));
  ctx.log(`fencing: L's claim delivered from sub-MPSC(s) ${[...lostChans]}; L's last delivery from them before the fence at ${rel(lastBeforeFence)}; ` +
    `fence at ${rel(tFence)} (ttl_seconds + ${GRACE_MS} ms); partition healed at ${rel(tRestore)}; ` +
    `R took them over from ${takeover.length ? rel(Math.min(...takeover.map((r) => r.at))) : "never"} (${takeover.length} deliveries); ` +
    `L deliveries from them after the fence: ${lLost.filter((r) => r.at > tFence).length}, stale ${stale.length}`);
  assert.equal(stale.length, 0, `bridge L kept delivering from the claim it lost: ${stale.length} deliveries after the fence, e.g. ` +
    stale.slice(0, 5).map((r) => `${r.id} from sub-MPSC ${r.chan} at ${rel(r.at)}${rHas(r.id) ? " (also delivered by R)" : ""}`).join(", "));
  // Duplicates, bounded by what was in flight: every id delivered more than once was published
  // more than once (a retried publish may be stored twice), or was handed out by L from the lost
  // claim before the fence and then again by R, which drains the lost sub-MPSC from its last
  // committed offset (L's acks after the cut could not be committed: its unacked and its
  // acked-but-uncommitted window). Anything else is a duplicate fencing does not explain.
  const retried = new Set([...res.attempts].filter(([, n]) => n > 1).map(([id]) => id));
  const dupIds = [...byId].filter(([, rs]) => rs.length > 1).map(([id]) => id);
  const windowIds = new Set(lLost.filter((r) => r.at <= tFence).map((r) => r.id));
  const unexplained = dupIds.filter((id) => !retried.has(id) && !(windowIds.has(id) && rHas(id)));
  ctx.log(`duplicates: ${dupIds.length} ids (${dupIds.filter((id) => retried.has(id)).length} published more than once, ` +
    `${dupIds.filter((id) => windowIds.has(id) && rHas(id)).length} from L's lost claim redelivered by R); ` +
    `bound: ${retried.size} retried publishes + ${windowIds.size} ids L delivered from the lost claim before the fence`);
  assert.ok(dupIds.length <= retried.size + windowIds.size, `duplicates ${dupIds.length} > in flight ${retried.size} + ${windowIds.size}`);
  assert.equal(unexplained.length, 0, `duplicates not explained by a publish retry or the lost claim's window: ${unexplained.slice(0, 5).map((id) => `${id}: ${byId.get(id).map((x) => `${x.br}/${x.chan}@${rel(x.at)}/d${x.dl}`).join(",")}`).join("; ")}`);
  const lines = L.log().slice(logFrom).split("\n");
  const fenced = lines.filter((l) => /commit refused|lease \d+ expired|lease lost|not confirmed by etcd/.test(l));
  ctx.log(`bridge L after the partition: ${fenced.length} fencing line(s):\n    ${fenced.slice(0, 6).join("\n    ")}`);
  assert.ok(fenced.some((l) => /lease \d+ expired|lease lost/.test(l)), "bridge L noticed that its member lease expired (its stale claim stopped)");
  for (const br of [L, R]) {
    const ex = await br.stop();
    assert.equal(ex.code, 0, `${br.name} exit ${JSON.stringify(ex)}`);
  }
}, { timeout: 150_000 });
