// e2e_natscli_consumer_next: a pull consumer served through the bridge's JetStream API with the
// real nats CLI. 50 messages published; `nats consumer next orders workers --count 50 --ack`
// (50 pull requests of batch 1, each message acked on the "$JS.ACK." reply) gets each message
// once, on its first attempt; after the consumer's ack_wait nothing comes back: the backlog is
// empty, no redelivery is counted and a no_wait pull is answered 404 No Messages.
import fs from "node:fs";
import path from "node:path";
import { test } from "./lib/runner.mjs";
import { startStack, runCmd, natsCli, metricValue } from "./lib/stack.mjs";
import { natsConnect, makeMsg, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

test("e2e_natscli_consumer_next", async (ctx) => {
  const nats = await natsCli(); // first run: builds it (skipped when present)
  const st = await startStack(ctx);
  const b = await st.bridge({ name: "n1" }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const home = path.join(ctx.dir, "home");
  fs.mkdirSync(home, { recursive: true });
  const cli = async (args, timeout = 30_000) => {
    const r = await runCmd("env", [`HOME=${home}`, nats, "--server", st.nats.url, "--timeout", "5s", ...args], { timeout });
    ctx.log(`nats ${args.join(" ")} -> ${r.code}\n${(r.stdout + r.stderr).trimEnd().slice(0, 3000)}`);
    return r;
  };
  let r = await cli(["consumer", "add", "orders", "workers", "--pull", "--deliver", "all", "--ack", "explicit",
    "--replay", "instant", "--filter", "", "--max-deliver", "5", "--max-pending", "100", "--wait", "2s",
    "--max-waiting", "64", "--backoff", "none", "--no-headers-only"]);
  assert.equal(r.code, 0, `nats consumer add: ${r.stdout}${r.stderr}`);

  const N = 50;
  const res = await publishAll(nc, Array.from({ length: N }, (_, i) => makeMsg("nx", i, "orders.next")));
  assert.equal(res.acked.size, N);
  await waitBacklog(nc, "orders", N);

  const t0 = Date.now();
  r = await cli(["consumer", "next", "orders", "workers", "--count", String(N), "--ack"], 180_000);
  ctx.log(`consumer next --count ${N}: ${Date.now() - t0} ms`);
  assert.equal(r.code, 0, `nats consumer next: ${r.stderr}`);
  const ids = [...r.stdout.matchAll(/"id":"nx-(\d+)"/g)].map((m) => Number(m[1]));
  const tries = [...r.stdout.matchAll(/tries: (\d+)/g)].map((m) => Number(m[1]));
  assert.equal(ids.length, N, `${N} messages received (got ${ids.length})`);
  assert.equal(new Set(ids).size, N, "each message once");
  assert.equal(tries.length, N, "JetStream metadata parsed from each $JS.ACK reply");
  assert.ok(tries.every((t) => t === 1), `every message on its first attempt: ${tries}`);
  // JetStream metadata from the ack reply; the subject is the one published on (as JetStream's
  // pull deliveries: the hub takes it from the reply), also in Fluxon-Subject
  assert.equal([...r.stdout.matchAll(/subj: orders\.next \/ tries: 1 \/ cons seq: \d+ \/ str seq: \d+/g)].length, N);
  assert.equal([...r.stdout.matchAll(/Fluxon-Subject: orders\.next/g)].length, N, "Fluxon-Subject on each");

  await waitBacklog(nc, "orders", 0, 20_000); // every ack committed
  // past the consumer's ack_wait (2 s): nothing is redelivered
  await new Promise((res2) => setTimeout(res2, 3500));
  const ms = await b.metrics();
  assert.equal(metricValue(ms, "fluxon_redelivered_total", { channel: "orders" }) || 0, 0, "no redelivery");
  assert.equal(metricValue(ms, "fluxon_acked_total", { channel: "orders" }), N, "fluxon_acked_total");
  const m = await nc.request("$JS.API.CONSUMER.MSG.NEXT.orders.workers", JSON.stringify({ batch: 1, no_wait: true }), { timeout: 5000 });
  assert.equal(m.headers?.code, 404, "no_wait on an empty consumer: 404");
  assert.equal(m.headers?.description, "No Messages");
  const ex = await b.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
}, { timeout: 660_000 }); // the first run builds the CLI
