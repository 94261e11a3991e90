// e2e_natscli_bench_js: the standard benchmark tool against the bridge, unchanged command lines.
// `nats bench orders.bench --js --stream orders --pub 1 --msgs 2000 --syncpub` (each publish
// waits for its PubAck), then `--pull --consumer benchc --sub 2 --msgs 2000` (nats.go
// PullSubscribe + Fetch on the durable consumer, every message acked); the same with async
// publishing (--pubbatch 100 PubAck futures). Every message is consumed once: the bench's
// subscribers end only when they got their share (2 x 1000), the bridge counts 4000 acked and no
// redelivery, and the channel is empty. Then nats bench's own durable (created without a
// filter, deleted at its end). nats.go's PullSubscribe binds to the existing consumer
// only when its filter is empty or equal to the bench subject; a filter that names every subject of
// the channel means "every message" and is accepted (stored without a filter), a narrower one is
// refused with JetStream's error shape (a consumer gets every message of its channel).
import fs from "node:fs";
import path from "node:path";
import { test } from "./lib/runner.mjs";
import { startStack, runCmd, natsCli, metricValue, SLOW } from "./lib/stack.mjs";
import { natsConnect, waitBacklog, channelInfo } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

/** The backlog once the bridge's ack batches are committed: the same value twice, 500 ms apart. */
async function waitBacklogSettled(nc) {
  let prev = -1;
  for (const deadline = Date.now() + 30_000 * SLOW; ;) {
    const cur = (await channelInfo(nc, "orders")).backlog;
    if (cur === prev || Date.now() > deadline) return cur;
    prev = cur;
    await new Promise((res) => setTimeout(res, 500)); // observation window: the backlog settles
  }
}

test("e2e_natscli_bench_js", async (ctx) => {
  const nats = await natsCli(); // first run: builds it (skipped when present)
  const st = await startStack(ctx);
  const b = await st.bridge({ name: "n1" }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const home = path.join(ctx.dir, "home");
  fs.mkdirSync(home, { recursive: true });
  const cli = async (args, timeout = 60_000) => {
    const r = await runCmd("env", [`HOME=${home}`, nats, "--server", st.nats.url, "--timeout", "10s", ...args], { timeout });
    ctx.log(`nats ${args.join(" ")} -> ${r.code}\n${(r.stdout + r.stderr).trimEnd().slice(-3000)}`);
    return r;
  };
  const jsapi = async (subj, body) => JSON.parse(new TextDecoder().decode(
    (await nc.request(`$JS.API.${subj}`, JSON.stringify(body), { timeout: 5000 })).data));

  // Filters: the channel's subject (orders.>) and a superset (>) mean every message and are
  // stored without a filter; a narrower one (orders.bench) is refused.
  for (const [name, filter] of [["fall", "orders.>"], ["fsup", ">"]]) {
    const res = await jsapi(`CONSUMER.CREATE.orders.${name}.${filter}`, {
      stream_name: "orders", config: { durable_name: name, filter_subject: filter, ack_policy: "explicit" } });
    assert.ok(!res.error, `filter ${filter} covers the channel: accepted (${JSON.stringify(res.error)})`);
    assert.ok(!res.config.filter_subject, `stored without a filter: ${JSON.stringify(res.config)}`);
  }
  const narrow = await jsapi("CONSUMER.CREATE.orders.fnarrow.orders.bench", {
    stream_name: "orders", config: { durable_name: "fnarrow", filter_subject: "orders.bench", ack_policy: "explicit" } });
  assert.ok(narrow.error, "a narrower filter is refused");
  assert.match(narrow.error.description, /filter/);

  let r = await cli(["consumer", "add", "orders", "benchc", "--pull", "--deliver", "all", "--ack", "explicit",
    "--replay", "instant", "--filter", "", "--max-deliver", "5", "--max-pending", "1000", "--wait", "30s",
    "--max-waiting", "64", "--backoff", "none", "--no-headers-only"]);
  assert.equal(r.code, 0, `nats consumer add: ${r.stdout}${r.stderr}`);

  const N = 2000;
  const rounds = [["--syncpub"], []]; // one PubAck at a time, then async batches
  for (const pubFlags of rounds) {
    const what = pubFlags.length ? "sync" : "async";
    r = await cli(["bench", "orders.bench", "--js", "--stream", "orders", "--pub", "1", "--msgs", String(N),
      "--no-progress", ...pubFlags], 300_000);
    assert.equal(r.code, 0, `nats bench --pub (${what}): ${r.stderr.slice(-2000)}`);
    assert.match(r.stdout + r.stderr, /Pub stats: [\d,]+ msgs\/sec/, `${what} publish stats`);
    await waitBacklog(nc, "orders", N, 20_000);

    r = await cli(["bench", "orders.bench", "--js", "--stream", "orders", "--pull", "--consumer", "benchc",
      "--sub", "2", "--msgs", String(N), "--no-progress"], 300_000);
    assert.equal(r.code, 0, `nats bench --pull (${what}): ${r.stderr.slice(-2000)}`);
    assert.match(r.stdout + r.stderr, /Sub stats: [\d,]+ msgs\/sec/, `${what}: pull stats`);
    assert.ok(!/Fetch timeout|Fetch error/.test(r.stdout + r.stderr), `${what}: no fetch timeout`);
    await waitBacklog(nc, "orders", 0, 30_000); // every ack committed
  }
  // Without --consumer, nats bench defines its own durable (natscli-bench, no filter), pulls
  // through it and deletes it at the end.
  r = await cli(["bench", "orders.bench", "--js", "--stream", "orders", "--pub", "1", "--msgs", String(N),
    "--no-progress"], 300_000);
  assert.equal(r.code, 0, `nats bench --pub (third): ${r.stderr.slice(-2000)}`);
  await waitBacklog(nc, "orders", N, 20_000);
  r = await cli(["bench", "orders.bench", "--js", "--stream", "orders", "--pull", "--sub", "2",
    "--msgs", String(N), "--no-progress"], 300_000);
  assert.equal(r.code, 0, `nats bench --pull (its own consumer): ${r.stderr.slice(-2000)}`);
  assert.match(r.stdout + r.stderr, /Deleted durable consumer: natscli-bench/);
  const names = await jsapi("CONSUMER.NAMES.orders", {});
  assert.ok(!names.consumers.includes("natscli-bench"), `deleted: ${names.consumers}`);
  // nats bench deletes its consumer from its main connection right after its subscribers' last
  // acks, sent on their own connections: an ack the server passes on after the delete finds no
  // consumer (on JetStream too) and its message stays stored. Those are consumed again here.
  const left = await waitBacklogSettled(nc);
  let again = 0;
  if (left > 0) {
    ctx.log(`${left} message(s) whose ack came after nats bench deleted its consumer`);
    r = await cli(["consumer", "next", "orders", "benchc", "--count", String(left), "--ack"], 120_000);
    assert.equal(r.code, 0, `nats consumer next: ${r.stderr}`);
    const tries = [...r.stdout.matchAll(/tries: (\d+)/g)].map((m) => Number(m[1]));
    assert.equal(tries.length, left, "each left message comes back once");
    again = tries.filter((t) => t > 1).length;
  }
  await waitBacklog(nc, "orders", 0, 30_000);
  // A consumer that does not exist: nats.go creates it filtered on the bench subject, which is
  // narrower than the channel: refused with the reason (not a hang, not a partial consumer).
  r = await cli(["bench", "orders.bench", "--js", "--stream", "orders", "--pull", "--consumer", "nosuch",
    "--sub", "1", "--msgs", "10", "--no-progress"], 60_000);
  assert.notEqual(r.code, 0, "a narrower filter is refused");
  assert.match(r.stdout + r.stderr, /filtered consumers are not supported/);

  const ms = await b.metrics();
  // Acks commit in order per producer (deploy/README.md "Durability"): of the messages left
  // after nats bench deleted its consumer, those it had acked after one whose ack came too late
  // were delivered again with it and acked twice (JetStream tracks each ack and would not).
  // So: every message acked, none more than twice, and only the ones delivered again.
  const acked = metricValue(ms, "fluxon_acked_total", { channel: "orders" });
  ctx.log(`acked ${acked} for ${3 * N} messages; ${again} delivered again after the delete`);
  assert.ok(acked >= 3 * N && acked <= 3 * N + again,
    `each message acked once, or twice when delivered again after the delete: ${acked} (${3 * N} messages, ${again} again)`);
  assert.equal(metricValue(ms, "fluxon_redelivered_total", { channel: "orders" }) || 0, again,
    "no redelivery but the acks nats bench sent after deleting its consumer");
  const ci = await jsapi("CONSUMER.INFO.orders.benchc", {});
  assert.equal(ci.num_pending, 0, "consumer info: nothing pending");
  const ex = await b.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
}, { timeout: 900_000 }); // the first run builds the CLI
