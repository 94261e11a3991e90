// e2e_claim_churn_leaves_no_keys: claim churn leaves nothing behind in etcd. 200 names
// join and leave in 10 waves of 20, each wave getting 100 messages with explicit acks (so every
// sub-MPSC gets an attempt record, offsets, memberships and id counters); after the last name left,
// the channel's keys and the etcd leases come back to the idle baseline taken after one name had
// joined, consumed and left (the sub-MPSC kept for store-and-forward may be another one: its keys
// replace the baseline's). Checked: no key of a sub-MPSC that is not listed (attempt records,
// metas, offsets, counters, cluster-lease keys), the etcd key count and lease count back to the
// baseline; on the Redis payload plane (where a commit deletes payloads after its offsets txn,
// so leftovers are possible): Redis keys back to the baseline and no payload left.
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, metricValue, mpmcId, allKeys, subMpscIds, Redis, redisPlane } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert, assertCovers, assertNoConsumerErrors } from "./lib/check.mjs";

const WAVES = 10;
const PER_WAVE = 20;
const MSGS = 100;

async function leaseIds(etcd) {
  const res = await fetch(`${etcd.url}/v3/lease/leases`, { method: "POST", body: "{}", signal: AbortSignal.timeout(3000) });
  if (res.status !== 200) throw new Error(`etcd lease list: HTTP ${res.status}`);
  const j = await res.json();
  return (j.leases || []).map((l) => String(l.ID));
}

// The sub-MPSC a key belongs to (bridge/keys.h, attempts.h), or null.
function subOf(key, prefix) {
  const rel = key.slice(prefix.length);
  const m = /^\/(?:channels\/meta\/(\d+)$|channels\/(\d+)\/|attempts\/(\d+)$|cluster_lease\/(?:id_allocator\/)?channels\/(\d+)$|dist_id_allocator\/channels\/(\d+)(?:\/|$)|kv\/mpmc\/\d+\/mpsc_(\d+)\/)/.exec(rel);
  if (!m) return null;
  return m.slice(1).find((x) => x !== undefined);
}

/** Redis keys under the bridge's kv prefix, and payload members in its lease sets. */
async function redisState(redis, prefix) {
  const keys = (await redis.cli(["--scan", "--pattern", `${prefix}/*`])).stdout.split("\n").filter(Boolean);
  let payloads = 0;
  for (const k of keys) {
    if (!k.startsWith(`${prefix}/kv/l:`)) continue;
    payloads += Math.max(0, Number((await redis.cli(["ZCARD", k])).stdout.trim()) - 1);
  }
  return { keys: keys.length, payloads };
}

async function snapshot(st, id, redis) {
  const keys = (await allKeys(st.etcd, st.prefix)).map((k) => k.key);
  const listed = new Set(await subMpscIds(st.etcd, st.prefix, id));
  const orphans = keys.filter((k) => {
    const s = subOf(k, st.prefix);
    return s !== null && !listed.has(s);
  });
  const shape = new Map(); // key shape (digits as N) -> count, for the report
  for (const k of keys) {
    const s = k.slice(st.prefix.length).replace(/\d+/g, "N");
    shape.set(s, (shape.get(s) || 0) + 1);
  }
  return { keys, listed: [...listed], orphans, leases: await leaseIds(st.etcd), shape, redis: await redisState(redis, st.prefix) };
}

function shapeDiff(a, b) {
  const out = [];
  for (const k of new Set([...a.keys(), ...b.keys()])) {
    const d = (b.get(k) || 0) - (a.get(k) || 0);
    if (d) out.push(`${k} ${d > 0 ? "+" : ""}${d}`);
  }
  return out.join(", ") || "none";
}

test("e2e_claim_churn_leaves_no_keys", async (ctx) => {
  const t0 = Date.now();
  const st = await startStack(ctx);
  const defaults = { ttl_seconds: 3, release_after: "300ms", interest_poll: "100ms", ack: "explicit" };
  const redis = await new Redis(ctx, "redis", { appendfsync: "everysec" }).start();
  const A = st.bridge({ name: "A", defaults, config: redisPlane(redis) });
  await A.start();
  const pubNc = await natsConnect(ctx, st.nats.url, "pub");
  const claims = async () => metricValue(await A.metrics(), "fluxon_claims", { channel: "orders" }) || 0;
  let c = 0;
  let all = [];
  const round = async (tag, names) => {
    const nc = await natsConnect(ctx, st.nats.url, `subs-${tag}`);
    const cons = names.map((n) => new Consumer(nc, `q.orders.${n}`));
    await nc.flush();
    await waitFor(async () => (c = await claims()) >= names.length, { timeout: 30_000, interval: 100, what: () => `${names.length} claims (have ${c})` });
    const msgs = Array.from({ length: MSGS }, (_, i) => makeMsg(tag, i, `orders.k${i % 16}`));
    const res = await publishAll(pubNc, msgs, { concurrency: 32, timeout: 10_000 });
    assert.equal(res.failed.size, 0, `${tag}: not acked: ${res.failed.size}`);
    const acked = [...res.acked.keys()];
    const have = () => new Set(cons.flatMap((k) => [...k.counts.keys()]));
    await waitFor(() => have().size >= acked.length, { timeout: 30_000, interval: 100, what: () => `${tag}: every acked message delivered (have ${have().size}/${acked.length})` });
    assertNoConsumerErrors(cons);
    assertCovers(acked, [...have()], `${tag} acked messages`);
    await waitBacklog(pubNc, "orders", 0, 30_000);
    all = all.concat(acked);
    await nc.close(); // the names leave
    await waitFor(async () => (c = await claims()) === 0, { timeout: 30_000, interval: 100, what: () => `${tag}: claims released (have ${c})` });
  };

  // Idle baseline: one name joined, consumed and left; its sub-MPSC is the store-and-forward one.
  await round("base", ["b0"]);
  const id = await mpmcId(st.etcd, st.prefix, "orders");
  let base;
  await waitFor(async () => (base = await snapshot(st, id, redis)).listed.length === 1 && base.orphans.length === 0, { timeout: 30_000, interval: 250, what: () => `baseline settles (listed ${base?.listed.length}, orphans ${base?.orphans.length})` });
  ctx.log(`baseline: ${base.keys.length} keys, ${base.leases.length} leases, sub-MPSCs ${base.listed}; Redis ${base.redis.keys} keys, ${base.redis.payloads} payloads`);

  for (let w = 0; w < WAVES; w++) {
    await round(`w${w}`, Array.from({ length: PER_WAVE }, (_, i) => `w${w}n${i}`));
  }
  ctx.log(`${WAVES * PER_WAVE} names joined and left, ${all.length} messages acked and delivered`);

  // Everything of the churned sub-MPSCs goes (a closing claim reclaims its sub-MPSC; the keys of
  // the one kept replace the baseline's).
  let now;
  const ok = () => now.orphans.length === 0 && now.listed.length <= 1 && now.keys.length <= base.keys.length && now.leases.length <= base.leases.length && now.redis.keys <= base.redis.keys && now.redis.payloads === 0;
  try {
    await waitFor(async () => (now = await snapshot(st, id, redis), ok()), { timeout: 30_000, interval: 250, what: () => `keys and leases back to the baseline (keys ${now?.keys.length}/${base.keys.length}, leases ${now?.leases.length}/${base.leases.length}, orphans ${now?.orphans.length}, listed ${now?.listed.length}, Redis keys ${now?.redis.keys}/${base.redis.keys}, payloads ${now?.redis.payloads})` });
  } finally {
    if (now) {
      ctx.log(`after: ${now.keys.length} keys, ${now.leases.length} leases, sub-MPSCs ${now.listed}; Redis ${now.redis.keys} keys, ${now.redis.payloads} payloads; orphan keys ${now.orphans.length}${now.orphans.length ? ` (e.g. ${now.orphans.slice(0, 6).join(" ")})` : ""}`);
      ctx.log(`key shapes vs baseline: ${shapeDiff(base.shape, now.shape)}`);
    }
  }
  const reclaimed = metricValue(await A.metrics(), "fluxon_sub_mpscs_reclaimed_total", { channel: "orders" }) || 0;
  ctx.log(`reclaimed ${reclaimed} sub-MPSCs; wall ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  const ex = await A.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
}, { timeout: 240_000 });
