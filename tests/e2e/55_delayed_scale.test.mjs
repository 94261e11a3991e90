// e2e_delayed_scale: 1,000,000 delayed messages (Fluxon-Delay 24h: a far time) in one channel,
// published by nats.go with 4,096 PubAcks outstanding (tests/e2e/go/schedule -flood, one reply
// subject per publish: none may go unanswered). The
// bridge's RSS must not grow by 16 MiB or more from a warmed-up baseline (after the first
// 20,000) to the end (peak sampled every 200 ms, plus a few mover scans and counts over the
// full index afterwards): the index lives in etcd and the mover reads bounded windows.
// Logged for BENCHMARKS.md: the publish rate, etcd's db bytes per delayed message (payloads of
// delayed messages are in etcd on both planes, so Redis holds 0 B of them), the cost of one
// count_only over the index. fluxon_delayed_messages must show all of them.
// Under a sanitizer build it is skipped (counted): 1,000,000 publishes through an ASan bridge
// and etcd do not fit the CI budget. FXE2E_DELAY_SCALE_N changes N for a measuring run.
import fs from "node:fs";
import { test, Skip } from "./lib/runner.mjs";
import { startStack, runCmd, waitFor, SLOW } from "./lib/stack.mjs";
import { assert } from "./lib/check.mjs";
import { buildGo } from "./14_go_client_compat.test.mjs";
import { delayedMetric } from "./52_delayed_delivery.test.mjs";

const N = Number(process.env.FXE2E_DELAY_SCALE_N || 1_000_000);
const WARM = 20_000;
const MAX_GROWTH_MIB = 16;

function rssMiB(pid) {
  const s = fs.readFileSync(`/proc/${pid}/status`, "utf8");
  return Number((s.match(/^VmRSS:\s+(\d+)/m) || [])[1] || 0) / 1024;
}

async function etcdPost(etcd, p, body) {
  const r = await fetch(`${etcd.url}${p}`, { method: "POST", body: JSON.stringify(body), signal: AbortSignal.timeout(30_000) });
  if (r.status !== 200) throw new Error(`${p}: HTTP ${r.status}`);
  return r.json();
}

test("e2e_delayed_scale", async (ctx) => {
  if (process.env.FXT_SANITIZED)
    throw new Skip("sanitizer build: 1,000,000 delayed publishes through an instrumented bridge do not fit the CI budget (make test runs it)");
  const bin = await buildGo("schedule");
  const st = await startStack(ctx);
  // capacity above N: delayed messages count toward it
  const orders = { name: "orders", subjects: ["orders.>"], deliver_prefix: "q.orders", capacity: 2 * N + 100_000 };
  const bridge = await st.bridge({ name: "dsc", channels: [orders] }).start();
  const pid = bridge.proc.pid;
  const status = () => etcdPost(st.etcd, "/v3/maintenance/status", {});

  const flood = async (n) => {
    const r = await runCmd(bin, ["-flood", "-url", st.nats.url, "-subject", "orders.far", "-n", String(n), "-inflight", "4096", "-delay", "24h"], { timeout: 900_000 * SLOW });
    assert.equal(r.code, 0, `flood exit ${r.code}: ${r.stdout} ${r.stderr}`);
    const f = JSON.parse(r.stdout.trim().split("\n").pop());
    // one reply subject per publish: a PubAck that never came (60 s) is the bridge's
    assert.equal(f.unanswered, 0, `publishes never answered: ${f.unanswered} (first ids ${JSON.stringify(f.unanswered_ids)})`);
    return f;
  };
  const warm = await flood(WARM); // warm-up: the write path's buffers at full load
  const base = rssMiB(pid);
  const db0 = Number((await status()).dbSize);
  let peak = base;
  const timer = setInterval(() => { try { peak = Math.max(peak, rssMiB(pid)); } catch { /* gone */ } }, 200);
  ctx.defer(() => clearInterval(timer));
  const t0 = Date.now();
  const f = await flood(N - WARM);
  const pubMs = Date.now() - t0;
  ctx.log(`published ${N - WARM} delayed messages in ${(pubMs / 1000).toFixed(1)} s: ${Math.round(f.rate)} msg/s (nats.go, 4096 in flight), retried one at a time ${f.retried} (errors ${JSON.stringify(f.errors)})`);
  assert.equal(f.acked, N - WARM);

  // the gauge shows them all (count_only refresh), and the mover has scanned meanwhile
  // a publish retried after a lost PubAck may be stored twice: at least N, at most N + retried
  const retried = f.retried + warm.retried;
  await waitFor(async () => { const v = delayedMetric(await bridge.metricsText(), "orders"); return v >= N && v <= N + retried; }, { timeout: 20_000 * SLOW, what: `fluxon_delayed_messages ${N}` });
  const b64 = (s) => Buffer.from(s).toString("base64");
  const prefix = `${st.prefix}/delay/orders/`;
  const end = Buffer.from(prefix);
  end[end.length - 1] += 1;
  const tc = performance.now();
  const cnt = Number((await etcdPost(st.etcd, "/v3/kv/range", { key: b64(prefix), range_end: end.toString("base64"), count_only: true })).count);
  const countMs = performance.now() - tc;
  assert.ok(cnt >= N && cnt <= N + retried, `delay index keys ${cnt} (N ${N}, retried ${retried})`);
  // a few more mover rounds and counts over the full index (observation window)
  await new Promise((r) => setTimeout(r, 5000));
  clearInterval(timer);
  const endRss = rssMiB(pid);
  peak = Math.max(peak, endRss);
  const s1 = await status();
  const perMsg = (Number(s1.dbSize) - db0) / (cnt - WARM);
  ctx.log(`bridge RSS: ${base.toFixed(1)} MiB after ${WARM} -> peak ${peak.toFixed(1)} MiB, end ${endRss.toFixed(1)} MiB (growth ${(peak - base).toFixed(1)} MiB, bound ${MAX_GROWTH_MIB})`);
  ctx.log(`etcd: db ${db0} -> ${s1.dbSize} B: ${perMsg.toFixed(0)} B per delayed message (payload ${"~100"} B + key in etcd; Redis: 0 B, delayed payloads stay in etcd on both planes); one count_only over ${N} keys: ${countMs.toFixed(0)} ms`);
  assert.ok(peak - base < MAX_GROWTH_MIB, `bridge RSS grew ${(peak - base).toFixed(1)} MiB with ${N} delayed messages (bound ${MAX_GROWTH_MIB} MiB)`);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
}, { timeout: 1_200_000 });
