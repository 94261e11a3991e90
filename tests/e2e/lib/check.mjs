// check.mjs -- assertions over message sets with readable failures.
import assert from "node:assert/strict";

export { assert };

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
