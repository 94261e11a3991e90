// chaos.mjs -- a seeded random schedule of faults against a whole deployment on loopback, with
// histories judged by checker.mjs (in the spirit of Jepsen's queue workloads).
//   node tests/chaos/chaos.mjs   (run by tests/chaos/run.sh; environment below)
// CHAOS_NAME (test name printed in cmocka style), CHAOS_SECONDS (length of the fault schedule),
// CHAOS_SEED (the schedule: which fault, on what, when, for how long), FXE2E_BUILD (build dir),
// FXT_TMPDIR (temp root), CHAOS_KEEP (directory the histories and logs are copied to),
// CHAOS_SABOTAGE (shows that the checker can fail; never in make test): "redis-flushall" empties
// Redis half-way (acked payloads gone, as after a failover to an empty replica), "phantom"
// publishes a message nobody published through the bridge on a consumer's delivery subject.
//
// The deployment: a 3-member etcd cluster, one nats-server (leafnode listener), Redis (appendonly
// yes, appendfsync always; the bridges' payload plane with kv.require_fsync) and three bridges.
// Bridge b1 reaches etcd through one fault proxy per member (proxy.mjs); b2 and b3 directly.
// Load: 4 publishers (16 requests in flight each, every publish retried until it is acked or
// given up; publishers 1 and 3 set Nats-Msg-Id), two steady consumer names (c0, c1) and a churn
// of short-lived names (ch0..ch9, up to 6 at a time, each living 150-1200 ms, one joining every
// 100-400 ms), a consumer of the dead-letter channel; every consumer acks every delivery.
// Fault lanes (each lane one fault at a time; lanes overlap): bridges (kill -9 then restart,
// SIGSTOP for 1.2-3x ttl_seconds then SIGCONT, SIGTERM restart), etcd (SIGSTOP or kill -9 and
// restart of the leader or a follower; one member at a time, so quorum holds), Redis (kill -9,
// restart on its AOF), nats-server (restart, SIGTERM or kill -9), the etcd proxy of b1 (answers
// delayed, answers dropped, connections cut), SIGHUP reloads (a second channel added/removed).
// Lanes inject during storms of 12 s separated by calm spells of 5 s (churn and load only).
// Bridges that exit on their own are restarted (like systemd's Restart=always) and noted.
// After the schedule: every fault healed, churn and publishers stopped, then a drain with a
// deadline; then the checker.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { runAll, test, trapAsyncErrors } from "../e2e/lib/runner.mjs";
import {
  installExitHandlers, setRoot, root, startEtcdCluster, etcdLeader, NatsServer, Redis, Bridge, ORDERS,
  waitFor, httpGet, BUILD,
} from "../e2e/lib/stack.mjs";
import { natsConnect, makeMsg, parseBody, publishAcked, sc, channelInfo } from "../e2e/lib/client.mjs";
import { FaultProxy } from "./proxy.mjs";
import { check } from "./checker.mjs";

const NAME = process.env.CHAOS_NAME || "chaos";
const SECONDS = Number(process.env.CHAOS_SECONDS || 600);
const SEED = String(process.env.CHAOS_SEED || Math.floor(Math.random() * 2 ** 31));
if (!(SECONDS > 0)) throw new Error(`CHAOS_SECONDS must be a positive number (got ${process.env.CHAOS_SECONDS})`);

const TTL_S = 2;
const DEFAULTS = {
  ttl_seconds: TTL_S, ack_wait: "2s", release_after: "1s", interest_poll: "200ms",
  max_deliver: 5, backoff: ["100ms"],
};
const AUX = { name: "aux", subjects: ["aux.>"], deliver_prefix: "q.aux" };
const PUBLISHERS = 4;
const IN_FLIGHT = 16;
const PUB_TIMEOUT_MS = 3000;
const MAX_ATTEMPTS = 40;
const HEAL_MS = 120_000;
const STORM_S = 12;
const CALM_S = 5;
const DRAIN_MS = 90_000;
const QUIET_MS = 10_000;

// ---------------------------------------------------------------------------------------------
// Seeded randomness (mulberry32), one stream per lane so the lanes' schedules do not depend on
// each other.

function hash32(s) {
  let h = 2166136261;
  for (const ch of String(s)) {
    h ^= ch.charCodeAt(0);
    h = Math.imul(h, 16777619);
  }
  return h >>> 0;
}
function rng(seed, lane) {
  let a = hash32(`${seed}/${lane}`);
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    range: (lo, hi) => lo + (hi - lo) * next(),
    int: (n) => Math.floor(next() * n),
    pick: (arr) => arr[Math.floor(next() * arr.length)],
    weighted(pairs) { // [[value, weight], ...]
      const total = pairs.reduce((s, [, w]) => s + w, 0);
      let x = next() * total;
      for (const [v, w] of pairs) if ((x -= w) < 0) return v;
      return pairs[pairs.length - 1][0];
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Histories (JSON lines, buffered, written synchronously in chunks)

class History {
  constructor(file) {
    this.fd = fs.openSync(file, "w");
    this.buf = [];
  }
  add(obj) {
    this.buf.push(JSON.stringify(obj));
    if (this.buf.length >= 512) this.flush();
  }
  flush() {
    if (!this.buf.length) return;
    fs.writeSync(this.fd, this.buf.join("\n") + "\n");
    this.buf = [];
  }
  close() {
    this.flush();
    fs.closeSync(this.fd);
  }
}

/** The last [ERR] line a bridge process wrote in its current run (its log holds every run). */
function lastErrOfRun(proc) {
  if (!proc) return "";
  const log = proc.log();
  const run = log.slice(log.lastIndexOf("\n---- ") + 1).split("\n").filter((l) => l.includes("[ERR]"));
  return run.length ? run[run.length - 1].replace(/^\[\d+\] \S+ \S+ /, "") : "";
}

// ---------------------------------------------------------------------------------------------

test(NAME, async (ctx) => {
  const T0 = Date.now();
  const now = () => Date.now() - T0;
  const secs = () => (now() / 1000).toFixed(1);
  const H = {
    pub: new History(path.join(ctx.dir, "publish.jsonl")),
    del: new History(path.join(ctx.dir, "deliver.jsonl")),
    fault: new History(path.join(ctx.dir, "faults.jsonl")),
  };
  let closed = false;
  const closeHistories = () => {
    if (closed) return;
    closed = true;
    for (const h of Object.values(H)) h.close();
  };
  ctx.defer(closeHistories);
  fs.writeFileSync(path.join(ctx.dir, "meta.json"), JSON.stringify({ name: NAME, seed: SEED, seconds: SECONDS, ttl_seconds: TTL_S, defaults: DEFAULTS, started: new Date().toISOString() }, null, 1));
  console.log(`chaos: seed ${SEED}, ${SECONDS} s of faults (replay: make chaos CHAOS_SEED=${SEED} CHAOS_SECONDS=${SECONDS})`);
  const faultLog = (kind, target, phase, detail) => {
    H.fault.add({ t: now(), kind, target, phase, ...(detail !== undefined ? { detail } : {}) });
    if (!kind.startsWith("churn_")) console.log(`  +${secs()}s ${phase} ${kind}${target ? ` ${target}` : ""}${detail !== undefined ? ` ${detail}` : ""}`);
  };
  const note = (kind, target, detail) => faultLog(kind, target, "note", detail);

  // Keep the histories and logs (build dir) whatever the outcome, for the checker and a replay.
  const keepDir = process.env.CHAOS_KEEP || path.join(BUILD, `${NAME}-last`);
  ctx.defer(() => {
    closeHistories();
    fs.rmSync(keepDir, { recursive: true, force: true });
    fs.mkdirSync(keepDir, { recursive: true });
    for (const f of fs.readdirSync(ctx.dir)) {
      if (/\.(jsonl|json|log|conf)$/.test(f)) fs.copyFileSync(path.join(ctx.dir, f), path.join(keepDir, f));
    }
    console.log(`chaos: histories and logs kept in ${keepDir} (node tests/chaos/checker.mjs ${keepDir})`);
  });

  // ------------------------------------------------------------------ the deployment
  const [members, nats, redis] = await Promise.all([
    startEtcdCluster(ctx, 3),
    new NatsServer(ctx, "nats").start(),
    new Redis(ctx, "redis", { appendfsync: "always" }).start(),
  ]);
  const proxies = await Promise.all(members.map((m, i) => new FaultProxy(m.clientPort, `p${i + 1}`).start()));
  ctx.defer(() => Promise.all(proxies.map((p) => p.close())));
  const prefix = "/fxchaos";
  const bridges = ["b1", "b2", "b3"].map((name, i) => {
    const x = { name, aux: false, busy: false, paused: false };
    const endpoints = i === 0 ? proxies.map((p) => p.url) : [0, 1, 2].map((k) => members[(k + i) % 3].url);
    x.b = new Bridge(ctx, {
      name, nats, etcd: members[0], prefix, defaults: DEFAULTS,
      config: (cfg) => {
        cfg.etcd.endpoints = endpoints;
        cfg.kv = { backend: "redis", url: redis.url, require_fsync: true };
        cfg.channels = x.aux ? [ORDERS, AUX] : [ORDERS];
      },
    });
    return x;
  });
  await Promise.all(bridges.map((x) => x.b.start()));
  console.log(`chaos: etcd ${members.map((m) => m.clientPort).join(",")}, nats ${nats.port}, redis ${redis.port}, bridges ${bridges.map((x) => x.b.httpPort).join(",")}; setup ${secs()} s`);

  // ------------------------------------------------------------------ consumers
  const consumers = [];
  let delivered = 0;
  const delivIds = new Set();
  const onDelivery = (name, ch) => (err, m) => {
    if (err) return;
    const h = m.headers;
    const rec = { t: now(), id: null, c: name, ch, br: (m.reply || "").split(".")[3] || "", d: Number(h ? h.get("Fluxon-Delivered") : 0), seq: h ? h.get("Fluxon-Seq") : "" };
    try {
      const body = parseBody(m.data);
      rec.id = body.id;
      const xid = h ? h.get("X-Id") : "";
      if (xid !== body.id) rec.bad = `X-Id header ${JSON.stringify(xid)} != body id ${body.id}`;
    } catch (e) {
      rec.bad = e.message;
    }
    H.del.add(rec);
    delivered++;
    if (rec.id) delivIds.add(rec.id);
    if (m.reply) m.respond(sc.encode("+ACK"));
  };
  const subscribe = (nc, name, channel = "orders") => nc.subscribe(`q.${channel}.${name}`, { callback: onDelivery(name, channel) });
  for (const name of ["c0", "c1"]) {
    const nc = await natsConnect(ctx, nats.url, name);
    consumers.push(subscribe(nc, name));
    await nc.flush();
  }
  const dlqNc = await natsConnect(ctx, nats.url, "dlq");
  subscribe(dlqNc, "dlq", "orders-dlq");
  await dlqNc.flush();
  const churnNc = await natsConnect(ctx, nats.url, "churn");

  // ------------------------------------------------------------------ publishers
  const state = { stopPublishing: false, giveUpAt: Infinity, stopFaults: false, stopChurn: false };
  const ackedIds = new Set();
  let attempts = 0;
  const publisher = async (p) => {
    const nc = await natsConnect(ctx, nats.url, `pub${p}`);
    let n = 0;
    const worker = async () => {
      while (!state.stopPublishing) {
        const i = n++;
        const id = `p${p}-${i}`;
        const m = makeMsg(`p${p}`, i, `orders.p${p}.${i % 4}`, p % 2 === 1 ? { "Nats-Msg-Id": id } : {});
        for (let a = 1; ; a++) {
          const ts = now();
          attempts++;
          const r = await publishAcked(nc, m, PUB_TIMEOUT_MS);
          const rec = { id, p, a, ts, te: now(), ok: r.ok };
          if (r.ok) {
            rec.seq = r.ack.seq;
            if (r.ack.duplicate) rec.dup = true;
            ackedIds.add(id);
          } else {
            rec.code = r.code === undefined ? null : r.code;
            rec.err = String(r.error).slice(0, 160);
          }
          H.pub.add(rec);
          if (r.ok || a >= MAX_ATTEMPTS || Date.now() > state.giveUpAt) break;
          await sleep(100); // retry pacing while a bridge or the server is away
        }
      }
    };
    await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
  };
  const pubsDone = Promise.all(Array.from({ length: PUBLISHERS }, (_, p) => publisher(p)));

  // ------------------------------------------------------------------ churn of consumer names
  const churn = (async () => {
    const r = rng(SEED, "churn");
    const live = new Map(); // name -> {sub, until}
    while (!state.stopChurn) {
      await sleep(r.range(100, 400));
      const t = Date.now();
      for (const [name, s] of live) {
        if (s.until <= t) {
          s.sub.unsubscribe();
          live.delete(name);
          faultLog("churn_leave", name, "inject");
        }
      }
      const name = `ch${r.int(10)}`;
      const life = r.range(150, 1200);
      if (live.size < 6 && !live.has(name)) {
        live.set(name, { sub: subscribe(churnNc, name), until: t + life });
        faultLog("churn_join", name, "inject");
      }
    }
    for (const [, s] of live) s.sub.unsubscribe();
    await churnNc.flush().catch(() => {});
  })();

  // ------------------------------------------------------------------ bridge supervision
  const startBridge = async (x, why) => {
    for (let i = 1; i <= 8; i++) {
      if (x.b.proc && x.b.proc.running) {
        try {
          await x.b.waitHealthy(30_000);
          return true;
        } catch (e) {
          if (x.b.proc.running) {
            note("bridge_unhealthy", x.name, `not healthy 30 s after ${why}: ${String(e.message).split("\n")[0].slice(0, 160)}`);
            await x.b.kill9();
          }
        }
      }
      try {
        await x.b.start();
        return true;
      } catch (e) {
        const lastErr = lastErrOfRun(x.b.proc);
        note("bridge_start_failed", x.name, `${why}, try ${i}: ${String(e.message).split("\n")[0].replace(/; last lines:$/, "").slice(0, 120)}${lastErr ? `; last ERR: ${lastErr.slice(0, 200)}` : ""}`);
        if (!(x.b.proc && x.b.proc.running)) await sleep(1000);
      }
    }
    return false;
  };
  const supervisor = (async () => {
    while (!state.stopSupervisor) {
      await sleep(500);
      for (const x of bridges) {
        if (x.busy || !x.b.proc || x.b.proc.running) continue;
        x.busy = true;
        const lastErr = lastErrOfRun(x.b.proc);
        note("bridge_exit", x.name, `exited on its own ${JSON.stringify(x.b.proc.exit)}${lastErr ? ` (last ERR: ${lastErr.slice(0, 200)})` : ""}; restarted`);
        await startBridge(x, "its own exit");
        x.busy = false;
      }
    }
  })();

  // ------------------------------------------------------------------ fault lanes
  // Storms of STORM_S seconds with calm spells of CALM_S between them: in a storm every lane
  // injects; in a calm spell only the churn goes on, and the load runs at full speed (so binds,
  // claims and reclaims race many publishes, not only the retries of a stalled system).
  const END = T0 + SECONDS * 1000;
  const CYCLE = (STORM_S + CALM_S) * 1000;
  const untilStorm = () => {
    const into = (Date.now() - T0) % CYCLE;
    return into < STORM_S * 1000 ? 0 : CYCLE - into;
  };
  const lane = async (laneName, gap, step) => {
    const r = rng(SEED, laneName);
    for (;;) {
      const wait = r.range(gap[0], gap[1]) * 1000;
      if (Date.now() + wait >= END || state.stopFaults) return;
      await sleep(wait);
      const calm = untilStorm();
      if (calm > 0) {
        if (Date.now() + calm >= END) return;
        await sleep(calm);
      }
      await step(r);
    }
  };
  const bridgeLane = lane("bridges", [1, 4], async (r) => {
    const kind = r.weighted([["bridge_kill9", 3], ["bridge_pause", 3], ["bridge_sigterm", 1]]);
    const x = r.pick(bridges);
    const downMs = r.range(0, 3000);
    const pauseMs = r.range(1.2, 3) * TTL_S * 1000;
    while (x.busy) await sleep(100);
    x.busy = true;
    try {
      if (kind === "bridge_kill9") {
        faultLog(kind, x.name, "inject", `down ${Math.round(downMs)} ms`);
        await x.b.kill9();
        await sleep(downMs);
        await startBridge(x, "kill -9");
      } else if (kind === "bridge_pause") {
        faultLog(kind, x.name, "inject", `SIGSTOP ${Math.round(pauseMs)} ms (ttl ${TTL_S} s)`);
        x.b.proc.signal("SIGSTOP");
        x.paused = true;
        await sleep(pauseMs);
        x.b.proc.signal("SIGCONT");
        x.paused = false;
      } else {
        faultLog(kind, x.name, "inject");
        const ex = await x.b.stop({ timeout: 20_000 });
        if (ex && ex.code !== 0) note("bridge_sigterm_exit", x.name, JSON.stringify(ex));
        await startBridge(x, "SIGTERM");
      }
      faultLog(kind, x.name, "heal");
    } finally {
      x.busy = false;
    }
  });
  const etcdState = { busy: false };
  const etcdLane = lane("etcd", [1.5, 5], async (r) => {
    const kind = r.weighted([["etcd_pause", 1], ["etcd_kill9", 2]]);
    const wantLeader = r.next() < 2 / 3; // a leader loss makes every txn in flight ambiguous
    const ms = r.range(500, 4000);
    const followerPick = r.next();
    let leader = null;
    try {
      leader = await etcdLeader(members);
    } catch {
      /* no leader known right now */
    }
    let m = leader;
    if (!wantLeader || !m) {
      const followers = members.filter((x) => x !== leader);
      m = followers[Math.floor(followerPick * followers.length)];
    }
    const role = m === leader ? "leader" : "follower";
    etcdState.busy = true;
    try {
      if (kind === "etcd_pause") {
        faultLog(kind, `${m.name} (${role})`, "inject", `SIGSTOP ${Math.round(ms)} ms`);
        m.pause();
        await sleep(ms);
        m.resume();
      } else {
        faultLog(kind, `${m.name} (${role})`, "inject", `down ${Math.round(ms)} ms`);
        await m.proc.kill9();
        await sleep(ms);
        await restartEtcd(m);
      }
      faultLog(kind, m.name, "heal");
    } finally {
      etcdState.busy = false;
    }
  });
  const restartEtcd = async (m) => {
    for (let i = 1; i <= 5; i++) {
      try {
        await m.start();
        return;
      } catch (e) {
        note("etcd_start_failed", m.name, `try ${i}: ${String(e.message).split("\n")[0].slice(0, 160)}`);
        await sleep(1000);
      }
    }
  };
  const restartRedis = async () => {
    for (let i = 1; i <= 5; i++) {
      try {
        await redis.start();
        return;
      } catch (e) {
        note("redis_start_failed", "redis", `try ${i}: ${String(e.message).split("\n")[0].slice(0, 160)}`);
        await redis.stop();
        await sleep(1000);
      }
    }
  };
  const restartNats = async () => {
    for (let i = 1; i <= 5; i++) {
      try {
        await nats.start();
        return;
      } catch (e) {
        note("nats_start_failed", "nats", `try ${i}: ${String(e.message).split("\n")[0].slice(0, 160)}`);
        await nats.stop();
        await sleep(1000);
      }
    }
  };
  const redisLane = lane("redis", [3, 8], async (r) => {
    const ms = r.range(200, 2000);
    faultLog("redis_kill9", "redis", "inject", `down ${Math.round(ms)} ms`);
    await redis.kill9();
    await sleep(ms);
    await restartRedis();
    faultLog("redis_kill9", "redis", "heal");
  });
  const natsLane = lane("nats", [5, 12], async (r) => {
    const hard = r.next() < 0.5;
    const ms = r.range(0, 1500);
    const kind = hard ? "nats_kill9" : "nats_restart";
    faultLog(kind, "nats", "inject", `down ${Math.round(ms)} ms`);
    if (hard) await nats.proc.kill9();
    else await nats.stop();
    await sleep(ms);
    await restartNats();
    faultLog(kind, "nats", "heal");
  });
  const proxyLane = lane("proxy", [0.8, 3], async (r) => {
    const kind = r.weighted([["etcd_answers_delayed", 2], ["etcd_answers_dropped", 3], ["etcd_cut", 1]]);
    const delayMs = Math.round(r.range(100, 1500));
    // dropped answers mostly shorter than ttl_seconds: the puts in flight become ambiguous while
    // the bridge's member lease survives (longer windows fence the bridge instead)
    const windowMs = kind === "etcd_cut" ? r.range(500, 2 * TTL_S * 1000 + 1000)
      : kind === "etcd_answers_dropped" ? r.range(200, 2000) : r.range(300, 4000);
    faultLog(kind, "b1", "inject", `${Math.round(windowMs)} ms${kind === "etcd_answers_delayed" ? `, +${delayMs} ms each way` : ""}`);
    const mode = kind === "etcd_answers_delayed" ? "delay" : kind === "etcd_answers_dropped" ? "drop" : "cut";
    for (const p of proxies) p.set(mode, delayMs);
    await sleep(windowMs);
    for (const p of proxies) p.set("pass");
    faultLog(kind, "b1", "heal");
  });
  const hupLane = lane("hup", [1, 4], async (r) => {
    const x = r.pick(bridges);
    if (x.busy || !x.b.proc || !x.b.proc.running) return;
    x.aux = !x.aux;
    await x.b.writeConfig();
    faultLog("bridge_sighup", x.name, "inject", x.aux ? "adds channel aux" : "removes channel aux");
    x.b.proc.signal("SIGHUP");
  });

  // progress every 5 s
  const progress = setInterval(() => {
    console.log(`  +${secs()}s progress: ${attempts} publish attempts, ${ackedIds.size} acked, ${delivered} deliveries (${delivIds.size} distinct)`);
  }, 5000);
  ctx.defer(() => clearInterval(progress));

  const sabotage = (async () => {
    const what = process.env.CHAOS_SABOTAGE;
    if (!what) return;
    await sleep(SECONDS * 500);
    if (what === "redis-flushall") {
      faultLog("sabotage_redis_flushall", "redis", "inject");
      await redis.cli(["FLUSHALL"]);
    } else if (what === "phantom") {
      faultLog("sabotage_phantom", "q.orders.c0", "inject");
      const nc = await natsConnect(ctx, nats.url, "ghost");
      const m = makeMsg("ghost", 0, "orders.ghost");
      nc.publish("q.orders.c0", m.data, { headers: m.headers });
      await nc.flush();
    } else {
      throw new Error(`CHAOS_SABOTAGE: unknown value ${what} (redis-flushall, phantom)`);
    }
  })();
  const lanes = [bridgeLane, etcdLane, redisLane, natsLane, proxyLane, hupLane, sabotage];
  await Promise.all(lanes);
  console.log(`chaos: fault schedule over at +${secs()} s; healing everything`);

  // ------------------------------------------------------------------ heal
  state.stopFaults = true;
  for (const p of proxies) p.set("pass");
  for (const m of members) m.resume();
  for (const x of bridges) if (x.b.proc) x.b.proc.signal("SIGCONT");
  const healDeadline = Date.now() + HEAL_MS;
  for (const m of members) if (!m.proc.running) await restartEtcd(m);
  if (!redis.proc.running) await restartRedis();
  if (!nats.proc.running) await restartNats();
  await waitFor(async () => {
    for (const m of members) {
      const h = await httpGet(`${m.url}/health`, 1000);
      if (!(h.json && h.json.health === "true")) return false;
    }
    return true;
  }, { timeout: Math.max(5000, healDeadline - Date.now()), what: "every etcd member healthy" });
  state.stopChurn = true;
  await churn;
  // every bridge running and healthy (the supervisor restarts the ones that exited)
  await waitFor(async () => {
    for (const x of bridges) {
      if (x.busy || !x.b.proc || !x.b.proc.running) return false;
      const h = await x.b.health().catch(() => null);
      if (!(h && h.status === 200)) return false;
    }
    return true;
  }, { timeout: Math.max(5000, healDeadline - Date.now()), interval: 200, what: "every bridge healthy after the heal" });
  state.stopSupervisor = true;
  await supervisor;
  console.log(`chaos: everything healed at +${secs()} s; stopping the publishers`);

  // ------------------------------------------------------------------ stop the load, drain
  state.stopPublishing = true;
  state.giveUpAt = Date.now() + 30_000;
  await pubsDone;
  clearInterval(progress);
  const acked = [...ackedIds];
  console.log(`chaos: publishers stopped at +${secs()} s: ${attempts} attempts, ${acked.length} acked; draining`);
  // The drain ends when every acked id was delivered, or at DRAIN_MS, or earlier when the
  // channel and its dead-letter channel have had a backlog of 0 for QUIET_MS (CHANNEL.INFO: every
  // message committed, in-flight ones included; ack_wait is 2 s): what is missing then was
  // committed past without a delivery, or sits where no consumer will look.
  const adminNc = await natsConnect(ctx, nats.url, "admin");
  let quietSince = null;
  const missing = () => acked.length - acked.filter((id) => delivIds.has(id)).length;
  try {
    await waitFor(async () => {
      if (acked.every((id) => delivIds.has(id))) return true;
      let empty = false;
      try {
        const [a, b] = await Promise.all([channelInfo(adminNc, "orders"), channelInfo(adminNc, "orders-dlq")]);
        empty = a.backlog === 0 && b.backlog === 0;
      } catch {
        empty = false; // no answer: no conclusion
      }
      if (!empty) {
        quietSince = null;
        return false;
      }
      if (quietSince === null) quietSince = Date.now();
      if (Date.now() - quietSince >= QUIET_MS) {
        const e = new Error(`backlog 0 on orders and orders-dlq for ${QUIET_MS / 1000} s with ${missing()} acked id(s) never delivered`);
        e.fatal = true;
        throw e;
      }
      return false;
    }, { timeout: DRAIN_MS, interval: 500, what: () => `every acked message delivered (missing ${missing()} of ${acked.length})` });
    console.log(`chaos: drained at +${secs()} s`);
  } catch (e) {
    console.log(`chaos: drain incomplete at +${secs()} s: ${e.message}`);
  }
  // a short quiet period: late redeliveries (duplicates, phantoms) still land in the history
  await sleep(2000);
  for (const x of bridges) {
    const ex = await x.b.stop({ timeout: 20_000 });
    if (ex && ex.code !== 0) note("bridge_final_stop", x.name, JSON.stringify(ex));
  }
  closeHistories();

  // ------------------------------------------------------------------ the checker
  const verdict = check(ctx.dir);
  console.log(verdict.text);
  console.log(`chaos: total wall time ${secs()} s`);
  if (!verdict.ok) throw new Error(`chaos checker: ${verdict.counts.lost} lost, ${verdict.counts.phantom} phantom, ${verdict.counts.corrupt} corrupt (seed ${SEED})`);
}, { timeout: (SECONDS + 420) * 1000 });

// ---------------------------------------------------------------------------------------------
// main: temp root, exit handlers (every child is killed on exit, SIGINT, SIGTERM), one test.

let tmp = process.env.FXT_TMPDIR;
let ownRoot = false;
if (tmp) {
  tmp = path.join(tmp, "chaos");
  fs.mkdirSync(tmp, { recursive: true });
} else {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), "fluxon-chaos-"));
  ownRoot = true;
}
setRoot(tmp);
installExitHandlers(() => {
  if (ownRoot) fs.rmSync(tmp, { recursive: true, force: true });
});
trapAsyncErrors();
const failed = await runAll({ root: root(), filter: null });
if (!ownRoot) fs.rmSync(tmp, { recursive: true, force: true });
process.exit(failed ? 1 : 0);
