// sighup_reload_memory_flat: SIGHUP reloads that add and remove a channel do not grow
// the bridge. A removed channel (its capture subscriptions, producer state) and every replaced
// configuration are freed once nothing references them.
//  1. warm-up: 10 add/remove cycles (allocator arenas, thread stacks and cnats pools settle);
//     then the bridge's VmRSS is the baseline.
//  2. 200 cycles of two SIGHUP reloads, "add channel hup (subjects hup.>)" then "remove it" (each
//     add also brings its DLQ channel hup-dlq), each reload waited for through its "reload: ..."
//     log line (no fixed sleeps).
//  3. VmRSS growth over the 200 cycles under 2 MiB (not asserted under a sanitizer, whose
//     quarantine keeps freed memory by design; logged there), and nats-server's /subsz lists no
//     subscription on hup.> (the removed channel's subscription is gone), while orders.> is there.
//  4. The channel that stayed still takes publishes (PubAck).
import fs from "node:fs";
import { test } from "./lib/runner.mjs";
import { startStack, waitFor, httpGet, vmRssBytes, ORDERS } from "./lib/stack.mjs";
import { natsConnect, makeMsg, publishAll } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

const HUP = { name: "hup", subjects: ["hup.>"], deliver_prefix: "q.hup" };
const MIB = 1 << 20;

async function subjectsOnServer(monitorUrl) {
  const r = await httpGet(`${monitorUrl}/subsz?subs=1&limit=100000`, 3000);
  if (r.status !== 200 || !r.json) throw new Error(`/subsz: HTTP ${r.status}`);
  return (r.json.subscriptions_list || []).map((s) => s.subject);
}

test("sighup_reload_memory_flat", async (ctx) => {
  const st = await startStack(ctx);
  let channels = [ORDERS];
  const bridge = st.bridge({
    name: "hup",
    config: (cfg) => {
      cfg.channels = channels;
    },
  });
  await bridge.start();
  const pid = bridge.proc.pid;
  // "reload: ..." lines logged so far, reading only what the log gained since the last call
  const logPath = bridge.proc.logPath;
  let logPos = 0, tail = "", nReloads = 0;
  const reloads = () => {
    const fd = fs.openSync(logPath, "r");
    try {
      const size = fs.fstatSync(fd).size;
      if (size > logPos) {
        const b = Buffer.alloc(size - logPos);
        fs.readSync(fd, b, 0, b.length, logPos);
        logPos = size;
        const lines = (tail + b.toString("utf8")).split("\n");
        tail = lines.pop();
        nReloads += lines.filter((l) => /\[INF\] reload: \d+ channel\(s\) stopped/.test(l)).length;
      }
    } finally {
      fs.closeSync(fd);
    }
    return nReloads;
  };
  let done = 0;
  const reload = async (withHup) => {
    channels = withHup ? [ORDERS, HUP] : [ORDERS];
    await bridge.writeConfig();
    bridge.proc.signal("SIGHUP");
    done++;
    await waitFor(() => {
      if (!bridge.proc.running) {
        const e = new Error(`bridge exited during reload ${done}: ${JSON.stringify(bridge.proc.exit)}`);
        e.fatal = true;
        throw e;
      }
      return reloads() >= done;
    }, { timeout: 15_000, interval: 10, what: () => `reload ${done} logged (have ${reloads()})` });
  };

  // 1. warm-up
  for (let i = 0; i < 10; i++) {
    await reload(true);
    await reload(false);
  }
  const before = vmRssBytes(pid);

  // 2. 200 add/remove cycles
  const t0 = Date.now();
  for (let i = 0; i < 200; i++) {
    await reload(true);
    if (i === 0) {
      const subs = await waitFor(async () => {
        const s = await subjectsOnServer(st.nats.monitorUrl);
        return s.includes("hup.>") ? s : null;
      }, { timeout: 10_000, what: "hup.> subscribed while channel hup is configured" });
      assert.ok(subs.includes("orders.>"), "orders.> subscribed");
    }
    await reload(false);
  }
  const after = vmRssBytes(pid);
  const growth = after - before;
  ctx.log(`200 add/remove cycles (${done} reloads) in ${Date.now() - t0} ms; VmRSS ${(before / MIB).toFixed(2)} MiB -> ${(after / MIB).toFixed(2)} MiB (growth ${(growth / 1024).toFixed(0)} KiB)`);

  // 3. the removed channel's subscription is gone from the server; memory stayed flat
  const subs = await waitFor(async () => {
    const s = await subjectsOnServer(st.nats.monitorUrl);
    return s.includes("hup.>") ? null : s;
  }, { timeout: 10_000, what: "no hup.> subscription on the server after the channel was removed" });
  assert.ok(subs.includes("orders.>"), `orders.> still subscribed: ${JSON.stringify(subs)}`);
  if (process.env.FXT_SANITIZED) {
    ctx.log("sanitizer build: RSS growth logged, not asserted (the quarantine keeps freed memory)");
  } else {
    assert.ok(growth < 2 * MIB, `bridge VmRSS grew ${(growth / 1024).toFixed(0)} KiB over 200 add/remove cycles (limit 2048 KiB)`);
  }

  // 4. the channel that stayed takes publishes
  const nc = await natsConnect(ctx, st.nats.url, "pub");
  const m = makeMsg("hup", 1, "orders.after");
  const r = await publishAll(nc, [m], { retry: true, deadline: 15_000, timeout: 3000 });
  assert.equal(r.acked.size, 1, `publish after the reloads: ${JSON.stringify([...r.failed.values()][0])}`);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `stop: ${JSON.stringify(ex)}`);
}, { timeout: 300_000 });
