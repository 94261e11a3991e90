// bench_natscli_js (BENCHMARKS.md, `make bench`): the standard benchmark tool, the same `nats
// bench` command lines against the bridge and against a JetStream WorkQueue stream on this
// machine, side by side. Two nats-servers: one without JetStream, with the bridge beside it
// (channel "orders", subjects orders.>, etcd payload plane), and one with JetStream and a
// WorkQueue stream "orders" (subjects orders.>, file storage). On each, a durable pull consumer
// "benchc" (explicit ack); then, with only --server differing:
//   nats bench orders.bench --js --stream orders --pub 1 --msgs M --syncpub   (one PubAck at a time)
//   nats bench orders.bench --js --stream orders --pub 1 --msgs M             (async, --pubbatch 100)
//   nats bench orders.bench --js --stream orders --pull --consumer benchc --sub S --msgs 2M
// and the rates nats bench prints (Pub stats / Sub stats, msgs/s). Each target must end with an
// empty stream (every message consumed). FXBENCH_NATSCLI_MSGS (M, default 10000) and
// FXBENCH_NATSCLI_SUBS (S, default 2). Prints one markdown row per command line.
import fs from "node:fs";
import path from "node:path";
import { test } from "../lib/runner.mjs";
import { startStack, NatsServer, runCmd, natsCli } from "../lib/stack.mjs";
import { natsConnect, waitBacklog } from "../lib/client.mjs";
import { assert } from "../lib/check.mjs";

const M = Number(process.env.FXBENCH_NATSCLI_MSGS || 10_000);
const SUBS = Number(process.env.FXBENCH_NATSCLI_SUBS || 2);

test("bench_natscli_js", async (ctx) => {
  const nats = await natsCli();
  const st = await startStack(ctx);
  const bridge = await st.bridge({ name: "nb", defaults: { max_ack_pending: 10_000, ack_wait: "30s" } }).start();
  const jsServer = new NatsServer(ctx, "natsjs", { jetstream: true });
  await jsServer.start();
  const home = path.join(ctx.dir, "home");
  fs.mkdirSync(home, { recursive: true });
  const cli = async (url, args, timeout = 600_000) => {
    const r = await runCmd("env", [`HOME=${home}`, nats, "--server", url, "--timeout", "30s", ...args], { timeout });
    if (r.code !== 0) ctx.log(`nats ${args.join(" ")} -> ${r.code}\n${(r.stdout + r.stderr).slice(-2000)}`);
    assert.equal(r.code, 0, `nats ${args.join(" ")}`);
    return r.stdout + r.stderr;
  };
  const consumerAdd = ["consumer", "add", "orders", "benchc", "--pull", "--deliver", "all", "--ack", "explicit",
    "--replay", "instant", "--filter", "", "--max-deliver", "20", "--max-pending", "10000", "--wait", "30s",
    "--max-waiting", "512", "--backoff", "none", "--no-headers-only"];
  const jsNc = await natsConnect(ctx, jsServer.url, "js");
  const jsm = await jsNc.jetstreamManager();
  await jsm.streams.add({ name: "orders", subjects: ["orders.>"], retention: "workqueue", storage: "file",
    num_replicas: 1, discard: "new" });
  await cli(jsServer.url, consumerAdd);
  await cli(st.nats.url, consumerAdd);

  const base = ["bench", "orders.bench", "--js", "--stream", "orders", "--no-progress"];
  const lines = [
    { what: "publish, --syncpub", args: [...base, "--pub", "1", "--msgs", String(M), "--syncpub"], stat: /Pub stats: ([\d,]+) msgs\/sec/ },
    { what: "publish, async", args: [...base, "--pub", "1", "--msgs", String(M)], stat: /Pub stats: ([\d,]+) msgs\/sec/ },
    { what: `pull, ${SUBS} subs`, args: [...base, "--pull", "--consumer", "benchc", "--sub", String(SUBS), "--msgs", String(2 * M)], stat: /Sub stats: ([\d,]+) msgs\/sec/ },
  ];
  const nc = await natsConnect(ctx, st.nats.url);
  const rates = { bridge: [], jetstream: [] };
  for (const [target, url] of [["bridge", st.nats.url], ["jetstream", jsServer.url]]) {
    for (const l of lines) {
      const out = await cli(url, l.args);
      const m = l.stat.exec(out);
      assert.ok(m, `${target}: ${l.what}: nats bench printed its rate`);
      rates[target].push(Number(m[1].replace(/,/g, "")));
      ctx.log(`${target}: ${l.what}: ${m[1]} msgs/s`);
    }
    // every message consumed: the stream is empty
    if (target === "bridge") await waitBacklog(nc, "orders", 0, 30_000);
    else assert.equal((await jsm.streams.info("orders")).state.messages, 0, "JetStream stream empty");
  }
  const ms = await bridge.metrics();
  ctx.log(`bridge: fluxon_redelivered_total ${JSON.stringify(ms.filter((x) => x.name === "fluxon_redelivered_total").map((x) => x.value))}`);
  ctx.log(`| nats bench (M = ${M}; only --server differs) | bridge msgs/s | JetStream WorkQueue msgs/s | ratio |`);
  ctx.log("|---|---|---|---|");
  lines.forEach((l, i) => {
    const b = rates.bridge[i], j = rates.jetstream[i];
    ctx.log(`| \`nats ${l.args.join(" ")}\` | ${b} | ${j} | ${(b / j).toFixed(2)}x |`);
  });
  await bridge.stop();
}, { timeout: 1_200_000 });
