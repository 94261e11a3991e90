// e2e_natscli_streams: the real nats CLI (natscli 0.0.35, built once into build-tools/) sees each
// channel as a JetStream WorkQueue stream through the bridge's JetStream API: `nats stream ls`
// lists the channels, `nats stream info orders` shows the capture subjects, WorkQueue retention
// and a message count equal to the backlog (published, not consumed), `nats account info` counts
// the streams, and a stream delete is refused with a clear JetStream-shaped error; malformed
// requests get JetStream's 400 shapes.
import fs from "node:fs";
import path from "node:path";
import { test } from "./lib/runner.mjs";
import { startStack, runCmd, natsCli, ORDERS } from "./lib/stack.mjs";
import { natsConnect, makeMsg, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

test("e2e_natscli_streams", async (ctx) => {
  const nats = await natsCli(); // first run: builds it (skipped when present)
  const st = await startStack(ctx);
  await st.bridge({ name: "js1" }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const N = 25;
  const res = await publishAll(nc, Array.from({ length: N }, (_, i) => makeMsg("cli", i, "orders.cli")));
  assert.equal(res.acked.size, N, "every publish acknowledged");
  await waitBacklog(nc, "orders", N);

  // The CLI with no saved context (a private HOME) and the test server.
  const home = path.join(ctx.dir, "home");
  fs.mkdirSync(home, { recursive: true });
  const cli = async (...args) => {
    const r = await runCmd("env", [`HOME=${home}`, nats, "--server", st.nats.url, "--timeout", "5s", ...args], { timeout: 30_000 });
    ctx.log(`nats ${args.join(" ")} -> ${r.code}\n${(r.stdout + r.stderr).trimEnd()}`);
    return r;
  };

  let r = await cli("stream", "ls");
  assert.equal(r.code, 0, `nats stream ls: ${r.stderr}`);
  assert.match(r.stdout, /\borders\b/, "orders listed");
  assert.match(r.stdout, /\borders-dlq\b/, "its dead-letter channel listed");
  r = await cli("stream", "ls", "--names");
  assert.deepEqual(r.stdout.split(/\s+/).filter(Boolean).sort(), ["orders", "orders-dlq"]);

  r = await cli("stream", "info", "orders", "--json");
  assert.equal(r.code, 0, `nats stream info --json: ${r.stderr}`);
  const si = JSON.parse(r.stdout);
  assert.equal(si.config.name, "orders");
  assert.deepEqual(si.config.subjects, ORDERS.subjects, "subjects = the capture subjects");
  assert.equal(si.config.retention, "workqueue", "WorkQueue retention");
  assert.equal(si.config.max_msgs, 100000, "max_msgs = capacity");
  assert.equal(si.state.messages, N, "message count = backlog");
  r = await cli("stream", "info", "orders");
  assert.equal(r.code, 0);
  assert.match(r.stdout, /Retention:\s+WorkQueue/);
  assert.match(r.stdout, new RegExp(`Messages:\\s+${N}\\b`));
  assert.match(r.stdout, /Subjects:\s+orders\.>/);

  // An unknown stream: JetStream's 404 (the CLI would prompt for a stream instead: asked directly).
  const nf = JSON.parse(new TextDecoder().decode((await nc.request("$JS.API.STREAM.INFO.no-such-channel", "", { timeout: 5000 })).data));
  assert.deepEqual(nf.error, { code: 404, err_code: 10059, description: "stream not found" });

  // Bad requests get JetStream's error shape, and the bridge keeps answering.
  const ask = async (subj, body) => JSON.parse(new TextDecoder().decode((await nc.request(subj, body, { timeout: 5000 })).data));
  let bad = await ask("$JS.API.STREAM.NAMES", "{not json");
  assert.equal(bad.error.err_code, 10025, `invalid JSON: ${JSON.stringify(bad)}`);
  bad = await ask("$JS.API.STREAM.LIST", JSON.stringify({ offset: -5 }));
  assert.equal(bad.error.code, 400);
  bad = await ask("$JS.API.STREAM.NAMES", "[".repeat(70_000));
  assert.equal(bad.error.err_code, 10025, "a request over 64 KiB");
  bad = await ask("$JS.API.CONSUMER.CREATE.orders.x", "[".repeat(5000) + "]".repeat(5000));
  assert.equal(bad.error.err_code, 10025, "deep nesting");
  bad = await ask("$JS.API.STREAM.SNAPSHOT.orders", "");
  assert.equal(bad.error.err_code, 10003, "an API call the bridge does not serve");
  const names = await ask("$JS.API.STREAM.NAMES", JSON.stringify({ subject: "orders.eu.x" }));
  assert.deepEqual(names.streams, ["orders"], "subject filter");
  assert.equal(names.total, 1);

  r = await cli("account", "info");
  assert.equal(r.code, 0, `nats account info: ${r.stderr}`);
  assert.match(r.stdout, /Streams:\s+2\b/, "two streams: orders and orders-dlq");

  r = await cli("stream", "rm", "orders", "-f");
  assert.notEqual(r.code, 0, "stream delete refused");
  assert.match(r.stdout + r.stderr, /channels are configured in the bridge configuration/);
  r = await cli("stream", "info", "orders", "--json");
  assert.equal(JSON.parse(r.stdout).state.messages, N, "the backlog is still there");
}, { timeout: 660_000 }); // the first run builds the CLI: 40-90 s on a quiet machine, minutes under load
