// context.mjs -- which test an asynchronous step belongs to. The runner runs every test inside
// als.run(ctx, ...): timers, promises and callbacks the test starts carry its context, so an error
// they raise later (even after the test timed out and the next one started) is tagged to the test
// that caused it, and the library's waits (waitFor) end as soon as their test was aborted.
import { AsyncLocalStorage } from "node:async_hooks";

export const als = new AsyncLocalStorage();

/** The context of the test the calling code belongs to (null outside any test). */
export function owningContext() {
  return als.getStore() || null;
}

/** Thrown by library waits once their test was aborted (timed out). */
export class Aborted extends Error {
  constructor(name) {
    super(`test ${name} was aborted (timed out); this step of it stops here`);
    this.name = "Aborted";
    this.fatal = true;
  }
}

/** Throw Aborted if the calling code's test was aborted. */
export function throwIfAborted() {
  const ctx = owningContext();
  if (ctx && ctx.aborted) throw new Aborted(ctx.name);
}
