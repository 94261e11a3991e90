// e2e_idle_bridge_cpu: a bridge with a channel and nothing to do sleeps: over 3 s after start it
// uses under 15% of one core (utime + stime from /proc/<pid>/stat). A background thread whose
// wait returns at once (a relative time where an absolute deadline is due) spins a whole core.
import fs from "node:fs";
import { test } from "./lib/runner.mjs";
import { startStack, SLOW } from "./lib/stack.mjs";
import { assert } from "./lib/check.mjs";

function cpuTicks(pid) {
  const f = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
  const rest = f.slice(f.lastIndexOf(")") + 2).split(" ");
  return Number(rest[11]) + Number(rest[12]); /* utime, stime (fields 14, 15) */
}

test("e2e_idle_bridge_cpu", async (ctx) => {
  const st = await startStack(ctx);
  const bridge = await st.bridge({ name: "idle" }).start();
  await new Promise((r) => setTimeout(r, 1000)); /* let start-up work (opens, first scans) end */
  const pid = bridge.proc.pid;
  const t0 = cpuTicks(pid), w0 = Date.now();
  await new Promise((r) => setTimeout(r, 3000)); /* the measured window, not a synchronisation */
  const used = (cpuTicks(pid) - t0) / 100, wall = (Date.now() - w0) / 1000;
  const share = used / wall;
  ctx.log(`idle bridge: ${(share * 100).toFixed(1)}% of a core over ${wall.toFixed(1)} s`);
  assert.ok(share < 0.15 * SLOW, `idle bridge uses ${(share * 100).toFixed(1)}% of a core, want < ${15 * SLOW}%`);
  await bridge.stop();
});
