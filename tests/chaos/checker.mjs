// checker.mjs -- reads the histories of a chaos run and judges them (in the spirit of Jepsen's
// queue workloads: every publish attempt and every delivery is an operation in a history; the
// checker needs nothing else).
//   node tests/chaos/checker.mjs DIR     (DIR holds meta.json, publish.jsonl, deliver.jsonl,
//                                         faults.jsonl; make chaos keeps them in build/chaos-last/)
// History lines (JSON, one per line; t, ts, te: ms since the start of the run):
//   publish.jsonl  {id, p (publisher), a (attempt), ts, te, ok, seq?, dup?, code?, err?}
//   deliver.jsonl  {t, id|null, c (consumer name), ch (channel), br (bridge), d (Fluxon-Delivered),
//                   seq, bad? (why the body or its headers do not match a published message)}
//   faults.jsonl   {t, kind, target, phase ("inject" | "heal" | "note"), ...}
// Verdict: acked (some attempt got a PubAck), delivered (to any consumer of the channel or of
// its dead-letter channel), lost (acked, never delivered after the final drain), duplicated
// (delivered more than once), phantom (delivered, never published), corrupt (body or headers
// altered). Fails (exit 1) on any loss, phantom or corrupt delivery.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

function readJsonl(file) {
  if (!fs.existsSync(file)) return [];
  const out = [];
  for (const line of fs.readFileSync(file, "utf8").split("\n")) {
    if (!line) continue;
    try {
      out.push(JSON.parse(line));
    } catch {
      out.push({ unparsable: line.slice(0, 200) });
    }
  }
  return out;
}

/** A PubAck seq as the bridge builds it (plugin/dmctx.h dm_seq): sub-MPSC (13 bits) << 40 |
 * producer index (8 bits) << 32 | offset + 1. */
export function decodeSeq(seq) {
  const n = BigInt(seq);
  return { sub: Number((n >> 40n) & 0x1fffn), pidx: Number((n >> 32n) & 0xffn), offset: Number(n & 0xffffffffn) - 1 };
}
const fmtSeq = (seq) => {
  if (seq === undefined || seq === null) return "?";
  const d = decodeSeq(seq);
  return `sub-MPSC ${d.sub} producer ${d.pidx} offset ${d.offset}`;
};

/** Judge the histories in dir; returns {ok, text, counts}. */
export function check(dir) {
  const meta = fs.existsSync(path.join(dir, "meta.json")) ? JSON.parse(fs.readFileSync(path.join(dir, "meta.json"), "utf8")) : {};
  const pubs = readJsonl(path.join(dir, "publish.jsonl"));
  const dels = readJsonl(path.join(dir, "deliver.jsonl"));
  const faults = readJsonl(path.join(dir, "faults.jsonl"));

  const attempted = new Map(); // id -> {attempts, acked: first ok line|null, p}
  let attemptCount = 0;
  const errCodes = new Map();
  for (const r of pubs) {
    if (!r.id) continue;
    attemptCount++;
    let a = attempted.get(r.id);
    if (!a) attempted.set(r.id, (a = { attempts: 0, acked: null, p: r.p, firstTs: r.ts }));
    a.attempts++;
    if (r.ok) {
      if (!a.acked) a.acked = r;
    } else {
      const k = String(r.code);
      errCodes.set(k, (errCodes.get(k) || 0) + 1);
    }
  }
  const ackedIds = [...attempted].filter(([, a]) => a.acked).map(([id]) => id);

  const delivered = new Map(); // id -> {n, first, chs:Set}
  const phantoms = [];
  const corrupt = [];
  let deliveries = 0;
  const byConsumer = new Map();
  const byBridge = new Map();
  for (const r of dels) {
    deliveries++;
    byConsumer.set(r.c, (byConsumer.get(r.c) || 0) + 1);
    if (r.br) byBridge.set(r.br, (byBridge.get(r.br) || 0) + 1);
    if (r.bad) {
      corrupt.push(r);
      continue;
    }
    if (!r.id || !attempted.has(r.id)) {
      phantoms.push(r);
      continue;
    }
    let d = delivered.get(r.id);
    if (!d) delivered.set(r.id, (d = { n: 0, first: r, chs: new Set() }));
    d.n++;
    d.chs.add(r.ch);
  }
  const lost = ackedIds.filter((id) => !delivered.has(id));
  const dups = [...delivered].filter(([, d]) => d.n > 1);
  const extra = dups.reduce((s, [, d]) => s + d.n - 1, 0);
  const deadLettered = [...delivered].filter(([, d]) => [...d.chs].some((c) => c.endsWith("-dlq")));
  const deadOnly = deadLettered.filter(([, d]) => ![...d.chs].some((c) => !c.endsWith("-dlq")));
  const indeterminate = [...attempted].filter(([, a]) => !a.acked);
  const indetDelivered = indeterminate.filter(([id]) => delivered.has(id)).length;

  const injected = new Map();
  for (const f of faults) if (f.phase === "inject") injected.set(f.kind, (injected.get(f.kind) || 0) + 1);
  const notes = faults.filter((f) => f.phase === "note");

  const L = [];
  const fmtMap = (m) => [...m].sort((a, b) => String(a[0]).localeCompare(String(b[0]))).map(([k, v]) => `${k} ${v}`).join(", ") || "none";
  L.push(`chaos checker: seed ${meta.seed ?? "?"}, ${meta.seconds ?? "?"} s of faults, histories in ${dir}`);
  L.push(`  publish attempts  ${attemptCount} (${attempted.size} distinct ids; error replies retried: ${fmtMap(errCodes)})`);
  L.push(`  acked             ${ackedIds.length}`);
  L.push(`  indeterminate     ${indeterminate.length} (never acked; ${indetDelivered} of them delivered anyway, which is allowed)`);
  L.push(`  delivered         ${delivered.size} distinct ids in ${deliveries} deliveries (by consumer: ${fmtMap(byConsumer)}; by bridge: ${fmtMap(byBridge)})`);
  L.push(`  dead-lettered     ${deadLettered.length} ids reached the dead-letter channel (${deadOnly.length} never delivered on the channel itself)`);
  L.push(`  lost              ${lost.length} (acked, never delivered after the final drain)`);
  L.push(`  duplicated        ${dups.length} ids (${extra} extra deliveries)`);
  L.push(`  phantom           ${phantoms.length} (delivered, never published)`);
  L.push(`  corrupt           ${corrupt.length} (body or headers do not match what was published)`);
  L.push(`  faults injected   ${fmtMap(injected)}`);
  for (const n of notes.slice(0, 20)) L.push(`  note +${(n.t / 1000).toFixed(1)}s ${n.kind} ${n.target || ""} ${n.detail || ""}`);
  if (lost.length) {
    const bySub = new Map();
    for (const id of lost) {
      const k = fmtSeq(attempted.get(id).acked.seq).replace(/ producer.*/, "");
      bySub.set(k, (bySub.get(k) || 0) + 1);
    }
    L.push(`  lost by sub-MPSC  ${fmtMap(bySub)}`);
    L.push(`  lost ids (first 20), with the faults injected from 2 s before to 10 s after each PubAck (churn counted, not listed):`);
    for (const id of lost.slice(0, 20)) {
      const a = attempted.get(id);
      const at = a.acked.te;
      const near = faults.filter((f) => f.phase === "inject" && f.t >= at - 2000 && f.t <= at + 10_000);
      const named = near.filter((f) => !f.kind.startsWith("churn_")).map((f) => `${f.kind}(${f.target ?? ""})@${(f.t / 1000).toFixed(1)}s`);
      const churn = near.length - named.length;
      L.push(`    ${id}: acked at +${(at / 1000).toFixed(2)}s (${fmtSeq(a.acked.seq)}) after ${a.attempts} attempt(s); ${named.join(" ") || "no fault"}${churn ? `; churn ${churn}` : ""}`);
    }
  }
  for (const r of phantoms.slice(0, 10)) L.push(`  phantom: ${JSON.stringify(r)}`);
  for (const r of corrupt.slice(0, 10)) L.push(`  corrupt: ${JSON.stringify(r)}`);
  const ok = lost.length === 0 && phantoms.length === 0 && corrupt.length === 0 && ackedIds.length > 0;
  if (ackedIds.length === 0) L.push("  nothing was acked: the run proves nothing");
  L.push(`  verdict           ${ok ? "PASS" : "FAIL"}`);
  L.push(`  replay            make chaos CHAOS_SEED=${meta.seed ?? "?"} CHAOS_SECONDS=${meta.seconds ?? "?"}`);
  return {
    ok,
    text: L.join("\n"),
    counts: {
      attempts: attemptCount, ids: attempted.size, acked: ackedIds.length, indeterminate: indeterminate.length,
      delivered: delivered.size, deliveries, deadLettered: deadLettered.length, lost: lost.length,
      duplicated: dups.length, extraDeliveries: extra, phantom: phantoms.length, corrupt: corrupt.length,
      faults: Object.fromEntries(injected),
    },
  };
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const dir = process.argv[2];
  if (!dir) {
    console.error("usage: node tests/chaos/checker.mjs DIR");
    process.exit(2);
  }
  const r = check(dir);
  console.log(r.text);
  process.exit(r.ok ? 0 : 1);
}
