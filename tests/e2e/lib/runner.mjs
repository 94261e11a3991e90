// runner.mjs -- a small sequential test runner that prints cmocka-compatible lines, so that
// tests/run.sh can count them:
//   [==========] Running N test(s).
//   [ RUN      ] name
//   [       OK ] name | [  FAILED  ] name | [  SKIPPED ] name
//   [==========] N test(s) run.
//   [  PASSED  ] N test(s).
// Each test gets a context (see TestContext) whose deferred clean-ups run in reverse order after
// the test, whether it passed, failed or timed out. A test that exceeds its timeout is failed and
// its clean-ups still run (they kill every process the test started).

import fs from "node:fs";
import path from "node:path";
import { setTimeout as delay } from "node:timers/promises";
import { SLOW } from "./stack.mjs";

export class Skip extends Error {
  constructor(reason) {
    super(reason);
    this.name = "Skip";
  }
}

const registry = [];

/** Register a test. opts.timeout: milliseconds (default 90 s). */
export function test(name, fn, opts = {}) {
  registry.push({ name, fn, timeout: opts.timeout ?? 90_000 });
}

let current = null;

/** The running test's context (for library code that wants to report something). */
export function currentContext() {
  return current;
}

export class TestContext {
  constructor(name, root) {
    this.name = name;
    this.dir = fs.mkdtempSync(path.join(root, `${name}-`));
    this.cleanups = [];
    this.failureDumps = [];
    this.asyncErrors = [];
    this.t0 = Date.now();
  }
  /** Run fn at the end of the test (reverse order of registration). */
  defer(fn) {
    this.cleanups.push(fn);
  }
  /** On failure, call fn() and print what it returns (for example a daemon's log tail). */
  onFailure(fn) {
    this.failureDumps.push(fn);
  }
  /** Fail the test from anywhere (also from clean-up steps). */
  fail(err) {
    this.asyncErrors.push(err);
  }
  log(...args) {
    const s = ((Date.now() - this.t0) / 1000).toFixed(2);
    console.log(`  [${this.name} +${s}s]`, ...args);
  }
}

async function runCleanups(ctx) {
  while (ctx.cleanups.length) {
    const fn = ctx.cleanups.pop();
    try {
      await Promise.race([
        Promise.resolve().then(fn),
        delay(30_000).then(() => {
          throw new Error("clean-up step did not finish within 30 s");
        }),
      ]);
    } catch (e) {
      console.log(`  clean-up error in ${ctx.name}: ${e && e.stack ? e.stack : e}`);
    }
  }
}

/**
 * Run every registered test whose name matches `filter` (a RegExp or null), in registration
 * order. Returns the number of failed tests.
 */
export async function runAll({ root, filter }) {
  const tests = registry.filter((t) => !filter || filter.test(t.name));
  console.log(`[==========] Running ${tests.length} test(s).`);
  const failed = [];
  let skipped = 0;
  let passed = 0;
  for (const t of tests) {
    console.log(`[ RUN      ] ${t.name}`);
    const ctx = new TestContext(t.name, root);
    current = ctx;
    let outcome = "ok";
    let err = null;
    let timer;
    try {
      await Promise.race([
        Promise.resolve().then(() => t.fn(ctx)),
        new Promise((_, rej) => {
          const ms = t.timeout * SLOW;
          timer = setTimeout(() => rej(new Error(`test timed out after ${ms / 1000} s`)), ms);
        }),
      ]);
      if (ctx.asyncErrors.length) throw ctx.asyncErrors[0];
    } catch (e) {
      err = e;
      outcome = e instanceof Skip ? "skip" : "fail";
    } finally {
      clearTimeout(timer);
    }
    if (outcome === "fail") {
      console.log(`  FAILURE: ${err && err.stack ? err.stack : err}`);
      for (const dump of ctx.failureDumps) {
        try {
          const s = await dump();
          if (s) console.log(s);
        } catch (e) {
          console.log(`  (failure dump error: ${e})`);
        }
      }
    }
    const nErr = ctx.asyncErrors.length;
    await runCleanups(ctx);
    current = null;
    if (outcome !== "fail" && ctx.asyncErrors.length > nErr) {
      // e.g. a sanitizer report found when a daemon was stopped during clean-up
      outcome = "fail";
      console.log(`  FAILURE (during clean-up): ${ctx.asyncErrors[nErr].stack || ctx.asyncErrors[nErr]}`);
    }
    try {
      if (!process.env.FXE2E_KEEP) fs.rmSync(ctx.dir, { recursive: true, force: true });
    } catch (e) {
      console.log(`  could not remove ${ctx.dir}: ${e}`);
    }
    const secs = ((Date.now() - ctx.t0) / 1000).toFixed(1);
    if (outcome === "ok") {
      passed++;
      console.log(`[       OK ] ${t.name} (${secs} s)`);
    } else if (outcome === "skip") {
      skipped++;
      console.log(`  skipped: ${err.message}`);
      console.log(`[  SKIPPED ] ${t.name}`);
    } else {
      failed.push(t.name);
      console.log(`[  FAILED  ] ${t.name} (${secs} s)`);
    }
  }
  console.log(`[==========] ${tests.length} test(s) run.`);
  console.log(`[  PASSED  ] ${passed} test(s).`);
  // (no summary line for skips: tests/run.sh counts every "[  SKIPPED ]" line as one skip)
  if (skipped) console.log(`  ${skipped} test(s) skipped.`);
  if (failed.length) {
    console.log(`[  FAILED  ] ${failed.length} test(s), listed below:`);
    for (const n of failed) console.log(`[  FAILED  ] ${n}`);
  }
  return failed.length;
}

/** Route unhandled async errors into the running test (they fail it) instead of crashing. */
export function trapAsyncErrors() {
  const onErr = (e) => {
    if (current) current.asyncErrors.push(e);
    else console.log(`  unhandled async error outside a test: ${e && e.stack ? e.stack : e}`);
  };
  process.on("unhandledRejection", onErr);
  process.on("uncaughtException", onErr);
}
