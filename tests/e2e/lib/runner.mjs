// runner.mjs -- a small sequential test runner that prints cmocka-compatible lines, so that
// tests/run.sh can count them:
//   [==========] Running N test(s).
//   [ RUN      ] name
//   [       OK ] name | [  FAILED  ] name | [  SKIPPED ] name (reason on the line before)
//   [==========] N test(s) run.
//   [  PASSED  ] N test(s).
// Each test gets a context (see TestContext) whose deferred clean-ups run in reverse order after
// the test, whether it passed, failed or timed out; a clean-up step that throws fails the test.
// Every test runs inside its own async context (context.mjs): an error raised later by anything
// it started (a timer, a promise nobody awaits) is tagged to that test, never to the one running
// at the time. A test that exceeds its timeout is aborted: it fails, ctx.signal is aborted and
// ctx.aborted set (the library's waits stop at once), its clean-ups run (they kill every process
// it started), and the runner waits a bounded time for its body to unwind before the next test.

import fs from "node:fs";
import path from "node:path";
import { setTimeout as delay } from "node:timers/promises";
import { SLOW } from "./stack.mjs";
import { als } from "./context.mjs";

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

/** The names of every registered test, in registration order. */
export function registeredNames() {
  return registry.map((t) => t.name);
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
    this.aborted = false; // set when the test timed out or failed from outside its body
    this.finished = false; // set once its outcome was printed
    this.abortController = new AbortController();
    // settles (rejects) at the first error reported from outside the test's body (ctx.fail, an
    // unhandled rejection of the test's): the runner ends the test then instead of waiting for
    // the body to notice (e.g. a bridge that stopped on a sanitizer report)
    this.failedEarly = new Promise((_, rej) => (this._failEarly = rej));
    this.failedEarly.catch(() => {});
  }
  /** Aborted when the test times out (pass it to fetch, timers, ...). */
  get signal() {
    return this.abortController.signal;
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
    if (this.finished) lateError(this, err);
    else {
      this.asyncErrors.push(err);
      this._failEarly(err);
    }
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
      // A clean-up that fails (a process that would not stop, a connection that would not close)
      // fails its test: what it left behind can break the next one.
      console.log(`  clean-up error in ${ctx.name}: ${e && e.stack ? e.stack : e}`);
      ctx.asyncErrors.push(new Error(`clean-up step failed: ${e && e.message ? e.message : e}`));
    }
  }
}

/**
 * Run every registered test whose name matches `filter` (a RegExp or null; tests it leaves out are
 * not run and not counted: an explicit selection on the command line), in registration order.
 * `skip(name)` may return a reason: that test is not run and is reported as "[  SKIPPED ]" with
 * the reason, so it shows in the counts (exclusions of a suite run never vanish silently).
 * Returns the number of failed tests.
 */
export async function runAll({ root, filter, skip = null }) {
  const tests = registry.filter((t) => !filter || filter.test(t.name));
  console.log(`[==========] Running ${tests.length} test(s).`);
  const failed = [];
  let skipped = 0;
  let passed = 0;
  for (const t of tests) {
    console.log(`[ RUN      ] ${t.name}`);
    const why = skip ? skip(t.name) : null;
    if (why) {
      skipped++;
      console.log(`  skipped: ${why}`);
      console.log(`[  SKIPPED ] ${t.name}`);
      continue;
    }
    const ctx = new TestContext(t.name, root);
    current = ctx;
    let outcome = "ok";
    let err = null;
    let timer;
    // the body runs in the test's async context: whatever it starts is tagged with ctx
    const body = als.run(ctx, () => Promise.resolve().then(() => t.fn(ctx)));
    let bodySettled = false;
    body.then(
      () => (bodySettled = true),
      (e) => {
        bodySettled = true;
        if (ctx.finished || ctx.aborted) lateError(ctx, e);
      },
    );
    try {
      await Promise.race([
        body,
        ctx.failedEarly.catch((e) => {
          // abort the body like a timeout does: its waits stop, its later errors are its own
          ctx.aborted = true;
          ctx.abortController.abort(e);
          throw e;
        }),
        new Promise((_, rej) => {
          const ms = t.timeout * SLOW;
          timer = setTimeout(() => {
            ctx.aborted = true;
            ctx.abortController.abort(new Error(`test ${t.name} timed out`));
            rej(new Error(`test timed out after ${ms / 1000} s (aborted: its clean-ups run now; later errors from it are tagged "${t.name}")`));
          }, ms);
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
      // what else went wrong meanwhile (e.g. the sanitizer report behind a bridge's exit)
      for (const e of ctx.asyncErrors) if (e !== err) console.log(`  ALSO: ${e && e.stack ? e.stack : e}`);
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
    if (ctx.aborted && !bodySettled) {
      // its processes are gone now, so its awaits fail soon; give the body a bounded time to
      // unwind before the next test starts (whatever it raises later is still tagged to it)
      await Promise.race([body.catch(() => {}), delay(10_000)]);
      if (!bodySettled) console.log(`  ${t.name}: the aborted test body is still pending after its clean-ups; its later errors are tagged to it`);
    }
    current = null;
    if (outcome !== "fail" && ctx.asyncErrors.length > nErr) {
      // e.g. a sanitizer report found when a daemon was stopped during clean-up, or a clean-up
      // step that failed
      outcome = "fail";
      console.log(`  FAILURE (during clean-up): ${ctx.asyncErrors[nErr].stack || ctx.asyncErrors[nErr]}`);
    }
    try {
      if (!process.env.FXE2E_KEEP) fs.rmSync(ctx.dir, { recursive: true, force: true });
    } catch (e) {
      console.log(`  could not remove ${ctx.dir}: ${e}`);
    }
    const secs = ((Date.now() - ctx.t0) / 1000).toFixed(1);
    ctx.finished = true;
    ctx.outcome = outcome;
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
  if (lateFailures.size) {
    // a test that had already passed raised an error afterwards: the run fails (tests/run.sh
    // counts a non-zero exit without a FAILED line as one failure)
    console.log(`  late errors from tests that had passed: ${[...lateFailures].join(", ")}`);
  }
  return failed.length + lateFailures.size;
}

// Tests that had passed when an error of theirs arrived.
const lateFailures = new Set();

/** An error from a test that already ended (or was aborted): logged under its name, never
 * charged to the test running now; a test that had passed makes the run fail. */
function lateError(ctx, e) {
  if (e && e.name === "Aborted") return; // the abort itself unwinding the body
  const state = ctx.finished ? `after it ended (${ctx.outcome})` : "after it was aborted";
  console.log(`  [${ctx.name}] error ${state}: ${e && e.stack ? e.stack : e}`);
  if (ctx.finished && ctx.outcome === "ok") lateFailures.add(ctx.name);
}

/** Route unhandled async errors into the test they come from (they fail it) instead of
 * crashing; a test that is over (or aborted) gets them logged under its name. */
export function trapAsyncErrors() {
  const onErr = (e) => {
    const owner = als.getStore() || current;
    if (!owner) console.log(`  unhandled async error outside a test: ${e && e.stack ? e.stack : e}`);
    else if (owner.finished || owner.aborted) lateError(owner, e);
    else owner.fail(e);
  };
  process.on("unhandledRejection", onErr);
  process.on("uncaughtException", onErr);
}
