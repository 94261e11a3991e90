// e2e_dedup_window_bounded: the Nats-Msg-Id window is bounded (bridge/dedup.h, deploy/README.md
// "Nats-Msg-Id dedup"). N distinct ids are published within one duplicate_window, fast (async
// PubAcks, many in flight), on a channel whose bound (duplicate_max_ids) is a fraction of N, so
// the bound is passed several times. Checked, as the docs say:
//  - the dedup keys in etcd (count under R/dedup/orders/) never pass duplicate_max_ids, and etcd's
//    db (maintenance/status, compacted every second the way --auto-compaction does it) grows by
//    far less than N ids would take;
//  - the oldest ids are forgotten early (fluxon_dedup_forgotten_total, a WARN): the first id,
//    published again, is stored again; a duplicate of a recent id is still caught;
//  - nothing is lost: every PubAcked message is delivered exactly once (plus the re-stored one);
//  - an etcd lease keepalive (timed in a worker thread all through the run, while the bridge
//    revokes its oldest small leases) keeps p99 below ttl/3.
// N is FXE2E_DEDUP_N (default 60,000: 300,000 takes 2-4 minutes on the 2-core CI machine,
// where the bridge stores 1.4-3k ids/s with dedup under load); the bound is N/10, passed 10x.
import { Worker } from "node:worker_threads";
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, metricValue, Redis, redisPlane, ORDERS } from "./lib/stack.mjs";
import { natsConnect, natsHeaders, sc, waitBacklog } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

const N = Number(process.env.FXE2E_DEDUP_N || 60_000);
const MAX_IDS = Math.max(1000, Math.floor(N / 10));
const TTL = 5; // DEFAULTS.ttl_seconds

/** Run a loop in a worker thread until stop(), which resolves to the one message it posts. */
function inThread(code, workerData) {
  const w = new Worker(code, { eval: true, workerData });
  const done = new Promise((resolve) => w.once("message", resolve));
  return { stop: async () => { w.postMessage("stop"); const r = await done; await w.terminate(); return r; } };
}

/** Time lease keepalives in a thread of its own (the main loop is busy publishing). */
function keepaliveProbe(etcdUrl, ttl) {
  const code = `
    const { parentPort, workerData } = require("node:worker_threads");
    const { url, ttl } = workerData;
    const post = async (p, body) => {
      const r = await fetch(url + p, { method: "POST", body: JSON.stringify(body), signal: AbortSignal.timeout(30000) });
      return r.json();
    };
    let stop = false;
    parentPort.on("message", () => { stop = true; });
    (async () => {
      const g = await post("/v3/lease/grant", { TTL: String(ttl) });
      const lat = [];
      let lost = 0;
      while (!stop) {
        const t0 = performance.now();
        const r = await post("/v3/lease/keepalive", { ID: g.ID }).catch(() => ({}));
        lat.push(performance.now() - t0);
        if (!r.result || !r.result.TTL) lost++;
        await new Promise((res) => setTimeout(res, 100));
      }
      await post("/v3/lease/revoke", { ID: g.ID }).catch(() => {});
      parentPort.postMessage({ lat, lost });
    })().catch((e) => parentPort.postMessage({ error: String(e) }));
  `;
  return inThread(code, { url: etcdUrl, ttl });
}

/** Sample the dedup key count and etcd's db size every 200 ms, compacting each time, in a thread
 * of its own; stop() returns the maxima. */
function dbSampler(etcdUrl, prefix, rangeEnd, { db0, use0 }) {
  const code = `
    const { parentPort, workerData } = require("node:worker_threads");
    const { url, key, rangeEnd, db0, use0 } = workerData;
    const post = async (p, body) => {
      const r = await fetch(url + p, { method: "POST", body: JSON.stringify(body), signal: AbortSignal.timeout(10000) });
      if (r.status !== 200) throw new Error(p + ": HTTP " + r.status);
      return r.json();
    };
    const out = { maxKeys: 0, maxDb: db0, maxUse: use0, samples: 0, compactErrors: 0, log: [] };
    let stop = false;
    parentPort.on("message", () => { stop = true; });
    (async () => {
      while (!stop) {
        try {
          const [k, s] = await Promise.all([
            post("/v3/kv/range", { key, range_end: rangeEnd, count_only: true }),
            post("/v3/maintenance/status", {}),
          ]);
          out.maxKeys = Math.max(out.maxKeys, Number(k.count || 0));
          out.maxDb = Math.max(out.maxDb, Number(s.dbSize));
          out.maxUse = Math.max(out.maxUse, Number(s.dbSizeInUse || s.dbSize));
          out.samples++;
          await post("/v3/kv/compaction", { revision: s.header.revision }).catch(() => out.compactErrors++);
        } catch (e) {
          if (out.log.length < 20) out.log.push(String(e.message || e));
        }
        await new Promise((res) => setTimeout(res, 200));
      }
      parentPort.postMessage(out);
    })().catch((e) => parentPort.postMessage({ error: String(e) }));
  `;
  const key = Buffer.from(prefix).toString("base64");
  return inThread(code, { url: etcdUrl, key, rangeEnd, db0, use0 });
}

async function etcdPost(etcd, p, body) {
  const r = await fetch(`${etcd.url}${p}`, { method: "POST", body: JSON.stringify(body), signal: AbortSignal.timeout(10_000) });
  if (r.status !== 200) throw new Error(`${p}: HTTP ${r.status}`);
  return r.json();
}

const pct = (xs, q) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor(q * s.length))] : 0;
};

test("e2e_dedup_window_bounded", async (ctx) => {
  const st = await startStack(ctx);
  const redis = await new Redis(ctx, "redis", { appendfsync: "everysec" }).start();
  const orders = { ...ORDERS, duplicate_window: "10m", duplicate_max_ids: MAX_IDS, duplicate_max_bytes: 16 << 20 };
  // payloads in Redis: etcd holds the control state and the dedup window only
  const bridge = await st.bridge({ name: "dd", channels: [orders], config: redisPlane(redis) }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const b64 = (s) => Buffer.from(s).toString("base64");
  const prefix = `${st.prefix}/dedup/orders/`;
  const end = Buffer.from(prefix);
  end[end.length - 1] += 1;
  const status = () => etcdPost(st.etcd, "/v3/maintenance/status", {});
  const count = async () => Number((await etcdPost(st.etcd, "/v3/kv/range", { key: b64(prefix), range_end: end.toString("base64"), count_only: true })).count || 0);
  const s0 = await status();
  const db0 = Number(s0.dbSize);
  const use0 = Number(s0.dbSizeInUse || s0.dbSize);

  // The consumer: every delivery acked; counted by Nats-Msg-Id.
  const got = new Map();
  let bad = 0;
  nc.subscribe("q.orders.c", {
    callback: (err, m) => {
      if (err) return;
      const id = m.headers ? m.headers.get("Nats-Msg-Id") : "";
      if (!id) bad++;
      got.set(id, (got.get(id) || 0) + 1);
      if (m.reply) m.respond(sc.encode("+ACK"));
    },
  });
  await nc.flush();

  // Sampler: dedup key count and db size; compaction every second (the operator's
  // --auto-compaction, deploy/README.md), so the db size shows the live footprint. It runs in a
  // thread of its own: on this loop, 1024 publishers starved it (4 samples in a whole run).
  const sampler = dbSampler(st.etcd.url, prefix, end.toString("base64"), { db0, use0 });
  const probe = keepaliveProbe(st.etcd.url, TTL);

  // N distinct ids, fast: up to 1024 publishes in flight, PubAcks awaited asynchronously.
  const acked = new Map(); // id -> seq
  const errors = new Map();
  const t0 = Date.now();
  let next = 0;
  const publishOne = async (i) => {
    const id = `dd-${i}`;
    const h = natsHeaders();
    h.set("Nats-Msg-Id", id);
    for (let attempt = 0; attempt < 20; attempt++) {
      try {
        const r = JSON.parse(sc.decode((await nc.request("orders.dd", sc.encode(`m${i}`), { headers: h, timeout: 15_000 })).data));
        if (r.error) throw Object.assign(new Error(r.error.description), { code: r.error.code });
        assert.ok(!r.duplicate, `${id} is new: ${JSON.stringify(r)}`);
        acked.set(id, r.seq);
        return;
      } catch (e) {
        if (e.code === "ERR_ASSERTION") throw e;
        errors.set(String(e.code), (errors.get(String(e.code)) || 0) + 1);
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  };
  await Promise.all(Array.from({ length: 1024 }, async () => {
    for (let i = next++; i < N; i = next++) await publishOne(i);
  }));
  const pubS = (Date.now() - t0) / 1000;
  ctx.log(`${acked.size}/${N} PubAcked in ${pubS.toFixed(1)} s (${(N / pubS).toFixed(0)}/s); retried errors ${JSON.stringify([...errors])}`);
  assert.equal(acked.size, N, "every publish PubAcked");

  // A duplicate of a recent id is still caught; the oldest id was forgotten: stored again.
  const recent = `dd-${N - 1}`;
  const h1 = natsHeaders();
  h1.set("Nats-Msg-Id", recent);
  const dupRecent = JSON.parse(sc.decode((await nc.request("orders.dd", sc.encode("again"), { headers: h1, timeout: 10_000 })).data));
  const h2 = natsHeaders();
  h2.set("Nats-Msg-Id", "dd-0");
  const dupOldest = JSON.parse(sc.decode((await nc.request("orders.dd", sc.encode("again"), { headers: h2, timeout: 10_000 })).data));
  ctx.log(`again: ${recent} -> ${JSON.stringify(dupRecent)}; dd-0 -> ${JSON.stringify(dupOldest)}`);
  assert.equal(dupRecent.duplicate, true, "a duplicate of a recent id is caught");
  assert.equal(dupRecent.seq, acked.get(recent), "and names the stored seq");

  // Nothing lost: every acked message delivered once (dd-0 twice when it was stored twice).
  const twice = dupOldest.duplicate ? 1 : 2;
  await waitFor(() => got.size >= N && (got.get("dd-0") || 0) >= twice, { timeout: 120_000, interval: 200, what: () => `deliveries of ${N} ids (have ${got.size})` });
  await waitBacklog(nc, "orders", 0, 30_000);
  const ka = await probe.stop();
  const smp = await sampler.stop();
  assert.ok(!smp.error, `db sampler: ${smp.error}`);
  for (const e of smp.log) ctx.log(`sample: ${e}`);
  const { maxKeys, maxDb, maxUse, samples, compactErrors } = smp;
  const allS = (Date.now() - t0) / 1000;
  const dups = [...got].filter(([id, c]) => c !== (id === "dd-0" ? twice : 1));
  assert.equal(bad, 0, "every delivery carries its Nats-Msg-Id");
  assert.deepEqual(dups.slice(0, 5), [], `each acked id delivered once (${dups.length} off)`);
  assert.ok([...acked.keys()].every((id) => got.has(id)), "no acked id lost");

  // The bound, as documented.
  const ms = await bridge.metrics();
  const forgotten = metricValue(ms, "fluxon_dedup_forgotten_total", { channel: "orders" }) || 0;
  const live = metricValue(ms, "fluxon_dedup_ids", { channel: "orders" });
  // compacted once more, etcd frees the history behind the run: the db in use settles
  await etcdPost(st.etcd, "/v3/kv/compaction", { revision: (await status()).header.revision, physical: true })
    .catch(() => {}); // 400 when the sampler compacted at this revision already
  let settled = Infinity;
  await waitFor(async () => {
    const u = Number((await status()).dbSizeInUse);
    const done = u >= settled;
    settled = Math.min(settled, u);
    return done;
  }, { timeout: 20_000, interval: 1000, what: "etcd's db in use settles" });
  const s1 = await status();
  const keysEnd = await count();
  // where the keys of the bridge's root are (a diagnostic for the footprint)
  const all = await etcdPost(st.etcd, "/v3/kv/range", { key: b64(`${st.prefix}/`), range_end: b64(`${st.prefix}0`), keys_only: true });
  const by = {};
  for (const kv of all.kvs || []) {
    const k = Buffer.from(kv.key, "base64").toString().slice(st.prefix.length + 1).split("/")[0];
    by[k] = (by[k] || 0) + 1;
  }
  ctx.log(`keys under ${st.prefix}/ at the end: ${JSON.stringify(by)}`);
  ctx.log(`dedup keys: max ${maxKeys} over ${samples} samples, ${keysEnd} at the end (bound ${MAX_IDS}); forgotten ${forgotten}, live ${live}`);
  ctx.log(`etcd db: size ${db0} -> max ${maxDb} (+${((maxDb - db0) / 1048576).toFixed(1)} MiB), in use ${use0} -> max ${maxUse} (+${((maxUse - use0) / 1048576).toFixed(1)} MiB) during the run, ${settled} (+${((settled - use0) / 1048576).toFixed(1)} MiB: ${((settled - use0) / Math.max(1, keysEnd)).toFixed(0)} B per dedup key) once compacted; compaction errors ${compactErrors}`);
  assert.ok(samples >= 5, `sampled ${samples} times`);
  assert.ok(maxKeys <= MAX_IDS, `dedup keys ${maxKeys} stay within duplicate_max_ids ${MAX_IDS}`);
  assert.ok(forgotten >= N - MAX_IDS - 2 * 2048, `the oldest ids were forgotten: ${forgotten}`);
  assert.ok(!dupOldest.duplicate && dupOldest.seq !== acked.get("dd-0"), "the oldest id, forgotten early by the bound, is stored again");
  // deploy/README.md: each id is counted as key + value + 192 B (etcd measures 150-250 B per
  // live id); once compacted the db holds the bound's ids (+ the channel's few control keys).
  const bound = MAX_IDS * 512 + 2 * 1048576;
  assert.ok(settled - use0 <= bound, `etcd db in use, compacted: +${settled - use0} B, within ${bound} B`);
  // during the run (history between compactions included) still less than what the N ids alone
  // would hold live without the bound (about 150 B each)
  assert.ok(maxUse - use0 < N * 150, `etcd db in use during the run: +${maxUse - use0} B < ${N * 150} B`);
  assert.match(bridge.log(), /dedup window bound reached/, "the WARN says the window shortened");

  // Keepalives stayed fast while the oldest leases were revoked.
  assert.ok(!ka.error, `keepalive probe: ${ka.error}`);
  const p50 = pct(ka.lat, 0.5);
  const p99 = pct(ka.lat, 0.99);
  const max = Math.max(...ka.lat);
  ctx.log(`keepalives: ${ka.lat.length}, p50 ${p50.toFixed(1)} ms, p99 ${p99.toFixed(1)} ms, max ${max.toFixed(1)} ms, lost ${ka.lost}; whole run ${allS.toFixed(1)} s`);
  assert.ok(ka.lat.length >= 20, "keepalives measured");
  assert.equal(ka.lost, 0, "the probe's lease never expired");
  assert.ok(p99 < (TTL * 1000) / 3, `keepalive p99 ${p99.toFixed(0)} ms < ttl/3`);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
}, { timeout: Math.max(180_000, N * 2) }); // 60,000 ids: about 20-70 s (load)
