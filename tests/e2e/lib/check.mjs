// check.mjs -- assertions over message sets with readable failures.
import assert from "node:assert/strict";

export { assert };

/** How much a consumer's view of a rate-limited publisher's spacing may shrink: each message
 * reaches it after its store batch commits and a delivery round, and that latency varies from
 * batch to batch (seen: 85 ms on a quiet machine). 300 ms, times the slow factor, at most 700:
 * a publisher that ignored its rate still lands far below any bound built with it. */
export const REDRIVE_JITTER_MS = Math.min(700, 300 * Math.max(1, Number(process.env.FXE2E_SLOW ||
  process.env.FXT_SLOW || (process.env.FXT_SANITIZED ? 3 : 1)) || 1));

/** Compare an expected id collection with received ones: {missing:[], extra:[]}. */
export function diffIds(expected, received) {
  const exp = new Set(expected);
  const got = new Set(received);
  const missing = [...exp].filter((id) => !got.has(id));
  const extra = [...got].filter((id) => !exp.has(id));
  return { missing, extra };
}

function sample(a, n = 10) {
  return a.length > n ? `${a.slice(0, n).join(", ")} ... (${a.length})` : a.join(", ");
}

/** Fail unless received covers exactly expected (no missing, no extra). */
export function assertSameSet(expected, received, what = "messages") {
  const { missing, extra } = diffIds(expected, received);
  assert.ok(missing.length === 0 && extra.length === 0,
    `${what}: ${missing.length} missing [${sample(missing)}], ${extra.length} unexpected [${sample(extra)}]`);
}

/** Fail if any expected id was not received. */
export function assertCovers(expected, received, what = "messages") {
  const { missing } = diffIds(expected, received);
  assert.ok(missing.length === 0, `${what}: ${missing.length} lost [${sample(missing)}]`);
}

export function assertNoDuplicates(consumers, what = "deliveries") {
  const all = new Map();
  for (const c of consumers) for (const [id, n] of c.counts) all.set(id, (all.get(id) || 0) + n);
  const dups = [...all].filter(([, n]) => n > 1);
  assert.equal(dups.length, 0, `${what}: ${dups.length} duplicated ids [${sample(dups.map(([id, n]) => `${id}x${n}`))}]`);
}

/** Merge the per-id counts of several consumers. */
export function mergedCounts(consumers) {
  const all = new Map();
  for (const c of consumers) for (const [id, n] of c.counts) all.set(id, (all.get(id) || 0) + n);
  return all;
}

export function assertNoConsumerErrors(consumers) {
  for (const c of consumers) {
    assert.equal(c.errors.length, 0, `consumer ${c.subject}: ${c.errors.map((e) => e.message).slice(0, 5).join("; ")}`);
  }
}
