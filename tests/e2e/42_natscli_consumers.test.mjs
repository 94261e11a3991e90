// e2e_natscli_consumers: durable consumers through the bridge's JetStream API with the real nats
// CLI: `nats consumer add orders workers --pull ...` stores the consumer (its settings as given,
// the channel's defaults filled in), `nats consumer ls` lists it, `nats consumer info` shows it
// with num_pending = the backlog and nothing awaiting an ack (nothing was delivered); the config
// lives in etcd, so another bridge answers the same after the first one is gone; `nats consumer
// rm` deletes it (info then: consumer not found). Refusals: a push consumer, a filter. npm nats'
// jsm.consumers.add/list/delete (the CONSUMER.CREATE.<stream>.<name> form) work too.
import fs from "node:fs";
import path from "node:path";
import { test } from "./lib/runner.mjs";
import { startStack, runCmd, natsCli } from "./lib/stack.mjs";
import { natsConnect, makeMsg, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

test("e2e_natscli_consumers", async (ctx) => {
  const nats = await natsCli(); // first run: builds it (skipped when present)
  const st = await startStack(ctx);
  const b1 = await st.bridge({ name: "c1" }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const N = 30;
  const res = await publishAll(nc, Array.from({ length: N }, (_, i) => makeMsg("cons", i, "orders.cons")));
  assert.equal(res.acked.size, N);
  await waitBacklog(nc, "orders", N);

  const home = path.join(ctx.dir, "home");
  fs.mkdirSync(home, { recursive: true });
  const cli = async (...args) => {
    const r = await runCmd("env", [`HOME=${home}`, nats, "--server", st.nats.url, "--timeout", "5s", ...args], { timeout: 30_000 });
    ctx.log(`nats ${args.join(" ")} -> ${r.code}\n${(r.stdout + r.stderr).trimEnd()}`);
    return r;
  };
  const add = ["consumer", "add", "orders", "workers", "--pull", "--deliver", "all", "--ack", "explicit",
    "--replay", "instant", "--filter", "", "--max-deliver", "7", "--max-pending", "40", "--wait", "45s",
    "--max-waiting", "64", "--backoff", "none", "--no-headers-only"];
  let r = await cli(...add);
  assert.equal(r.code, 0, `nats consumer add: ${r.stdout}${r.stderr}`);
  r = await cli(...add); // the same config again: no error (create is idempotent)
  assert.equal(r.code, 0, `nats consumer add (again): ${r.stdout}${r.stderr}`);

  r = await cli("consumer", "ls", "orders", "--names");
  assert.equal(r.code, 0, `nats consumer ls: ${r.stderr}`);
  assert.deepEqual(r.stdout.split(/\s+/).filter(Boolean), ["workers"]);
  r = await cli("consumer", "ls", "orders");
  assert.equal(r.code, 0);
  assert.match(r.stdout, /workers/);

  const info = async (who) => {
    const x = await cli("consumer", "info", "orders", who, "--json");
    assert.equal(x.code, 0, `nats consumer info: ${x.stderr}`);
    return JSON.parse(x.stdout);
  };
  let ci = await info("workers");
  assert.equal(ci.stream_name, "orders");
  assert.equal(ci.name, "workers");
  assert.equal(ci.config.durable_name, "workers");
  assert.equal(ci.config.ack_policy, "explicit");
  assert.equal(ci.config.max_deliver, 7, "max_deliver as given");
  assert.equal(ci.config.max_ack_pending, 40, "max_ack_pending as given");
  assert.equal(ci.config.ack_wait, 45e9, "ack_wait as given (ns)");
  assert.equal(ci.config.max_waiting, 64);
  assert.equal(ci.num_pending, N, "num_pending = backlog");
  assert.equal(ci.num_ack_pending, 0, "nothing delivered: nothing awaits an ack");
  r = await cli("consumer", "info", "orders", "workers");
  assert.equal(r.code, 0);
  assert.match(r.stdout, /Pull Mode: true/);
  assert.match(r.stdout, new RegExp(`Unprocessed Messages: ${N}\\b`));

  // Refused with JetStream's error shape: a push consumer and a filtered one.
  r = await cli("consumer", "add", "orders", "pusher", "--target", "out.x", "--deliver-group", "", "--deliver", "all",
    "--ack", "explicit", "--replay", "instant", "--filter", "", "--max-deliver", "5", "--max-pending", "10",
    "--heartbeat=-1", "--flow-control", "--backoff", "none", "--no-headers-only");
  assert.notEqual(r.code, 0, "push consumer refused");
  assert.match(r.stdout + r.stderr, /subscribe to q\.orders\.pusher/);
  r = await cli("consumer", "add", "orders", "filtered", "--pull", "--deliver", "all", "--ack", "explicit",
    "--replay", "instant", "--filter", "orders.eu.>", "--max-deliver", "5", "--max-pending", "10",
    "--backoff", "none", "--no-headers-only");
  assert.notEqual(r.code, 0, "filtered consumer refused");
  assert.match(r.stdout + r.stderr, /filtered consumers are not supported/);

  // The JetStream 2.9 create subject (CONSUMER.CREATE.<stream>.<name>) through npm nats' jsm.
  const jsm = await nc.jetstreamManager();
  const added = await jsm.consumers.add("orders", { durable_name: "w2", ack_policy: "explicit", ack_wait: 5e9 });
  assert.equal(added.name, "w2");
  assert.equal(added.config.ack_wait, 5e9);
  assert.equal(added.config.max_deliver, 5, "max_deliver defaults to the channel's");
  const names = [];
  for await (const c of jsm.consumers.list("orders")) names.push(c.name);
  assert.deepEqual(names.sort(), ["w2", "workers"]);
  assert.equal(await jsm.consumers.delete("orders", "w2"), true);

  // The config is in etcd: with the first bridge gone, a second one answers the same.
  await b1.stop();
  await st.bridge({ name: "c2" }).start();
  ci = await info("workers");
  assert.equal(ci.config.max_deliver, 7, "config survives the bridge and is shared");
  assert.equal(ci.num_pending, N);

  r = await cli("consumer", "rm", "orders", "workers", "-f");
  assert.equal(r.code, 0, `nats consumer rm: ${r.stderr}`);
  r = await cli("consumer", "ls", "orders", "--names");
  assert.equal(r.stdout.trim(), "", "no consumer left");
  const nf = JSON.parse(new TextDecoder().decode((await nc.request("$JS.API.CONSUMER.INFO.orders.workers", "", { timeout: 5000 })).data));
  assert.deepEqual(nf.error, { code: 404, err_code: 10014, description: "consumer not found" });
}, { timeout: 660_000 }); // the first run builds the CLI: 40-90 s on a quiet machine, minutes under load
