// e2e_jetstream_coexistence: on a nats-server with JetStream on, a bridge with the JetStream API on
// the default prefix refuses to start (exit 2) with an error that names jetstream.domain and
// jetstream.api; with jetstream.domain set it starts, `nats --js-domain fx stream ls` reaches the
// bridge (its channels; npm nats' jetstreamManager({domain}) and nats.go's nats.Domain("fx") with
// a pull consumer too), and the server's own JetStream (default prefix) still serves its own
// stream: publishes to it are stored and `nats stream info` counts them.
import fs from "node:fs";
import path from "node:path";
import { test } from "./lib/runner.mjs";
import { startStack, runCmd, natsCli, bridgeRun, SLOW } from "./lib/stack.mjs";
import { buildGo } from "./14_go_client_compat.test.mjs";
import { natsConnect, makeMsg, publishAll, waitBacklog } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

test("e2e_jetstream_coexistence", async (ctx) => {
  const nats = await natsCli(); // first run: builds it (skipped when present)
  const st = await startStack(ctx, { natsOpts: { jetstream: true } });
  const nc = await natsConnect(ctx, st.nats.url);
  const jsm = await nc.jetstreamManager();
  await jsm.streams.add({ name: "REAL", subjects: ["real.>"], retention: "workqueue", storage: "memory" });

  // The settings are validated: a domain is a single subject token.
  const bad = st.bridge({ name: "baddomain", config: (c) => { c.jetstream = { domain: "a.b" }; } });
  await bad.writeConfig();
  const chk = await bridgeRun(["--check", "-c", bad.configPath]);
  assert.equal(chk.code, 2, `--check with jetstream.domain "a.b": ${chk.stdout}${chk.stderr}`);
  assert.match(chk.stdout + chk.stderr, /jetstream\.domain: "a\.b" is not a single subject token/);

  // Default prefix: refused, with the way out in the error.
  const refused = await st.bridge({ name: "nodomain" }).tryStart(20_000);
  assert.equal(refused.healthy, false, "a bridge on the default prefix must not start beside a real JetStream");
  assert.equal(refused.exit.code, 2, `exit code: ${JSON.stringify(refused.exit)}`);
  ctx.log(`refused: ${refused.output.split("\n").filter((l) => l.includes("[ERR]")).join("\n")}`);
  assert.match(refused.output, /already has a JetStream/);
  assert.match(refused.output, /jetstream\.domain/);
  assert.match(refused.output, /jetstream\.api/);

  // With a domain: starts and answers there.
  const b = await st.bridge({ name: "dom", config: (c) => { c.jetstream = { domain: "fx" }; } }).start();
  const home = path.join(ctx.dir, "home");
  fs.mkdirSync(home, { recursive: true });
  const cli = async (...args) => {
    const r = await runCmd("env", [`HOME=${home}`, nats, "--server", st.nats.url, "--timeout", "5s", ...args], { timeout: 30_000 });
    ctx.log(`nats ${args.join(" ")} -> ${r.code}\n${(r.stdout + r.stderr).trimEnd()}`);
    return r;
  };
  // nats.go with nats.Domain("fx"): AddConsumer, two workers PullSubscribe + Fetch, ConsumerInfo,
  // all through $JS.fx.API (tests/e2e/go/pull -domain fx -phase1).
  const gobin = await buildGo("pull");
  const gr = await runCmd(gobin, ["-url", st.nats.url, "-channel", "orders", "-capture", "orders.godom",
    "-dlq", "q.orders-dlq", "-consumer", "godom", "-domain", "fx", "-phase1", "-n", "20", "-slow", String(SLOW)],
  { timeout: 120_000 * SLOW });
  for (const l of gr.stdout.split("\n").filter(Boolean)) ctx.log(`go: ${l.slice(0, 2000)}`);
  if (gr.stderr) ctx.log(`go stderr: ${gr.stderr.slice(0, 2000)}`);
  const gres = gr.stdout.split("\n").find((l) => l.startsWith("RESULT "));
  assert.ok(gres, "the Go program printed its RESULT line");
  assert.deepEqual(JSON.parse(gres.slice(7)).failures || [], [], "nats.go with nats.Domain(\"fx\")");
  assert.equal(gr.code, 0, `go client exit ${gr.code}`);
  const r0 = await cli("--js-domain", "fx", "consumer", "ls", "orders", "--names");
  assert.ok(r0.stdout.split(/\s+/).includes("godom"), `the durable made through the domain is the bridge's: ${r0.stdout}`);

  const N = 10;
  let res = await publishAll(nc, Array.from({ length: N }, (_, i) => makeMsg("co", i, "orders.co")));
  assert.equal(res.acked.size, N);
  await waitBacklog(nc, "orders", N);
  let r = await cli("--js-domain", "fx", "stream", "ls", "--names");
  assert.equal(r.code, 0, `nats --js-domain fx stream ls: ${r.stderr}`);
  assert.deepEqual(r.stdout.split(/\s+/).filter(Boolean).sort(), ["orders", "orders-dlq"], "the bridge's channels, not the server's streams");
  r = await cli("--js-domain", "fx", "stream", "info", "orders", "--json");
  assert.equal(r.code, 0);
  assert.equal(JSON.parse(r.stdout).state.messages, N, "backlog through the domain");

  // A client library with the domain option (npm nats: jetstreamManager({domain})).
  const jsmFx = await nc.jetstreamManager({ domain: "fx" });
  const si = await jsmFx.streams.info("orders");
  assert.equal(si.config.retention, "workqueue");
  assert.equal(si.state.messages, N, "backlog through jetstreamManager({domain})");

  // The server's JetStream on the default prefix: its own stream, still working.
  r = await cli("stream", "ls", "--names");
  assert.equal(r.code, 0);
  assert.deepEqual(r.stdout.split(/\s+/).filter(Boolean), ["REAL"], "the server's JetStream answers the default prefix alone");
  const js = nc.jetstream();
  for (let i = 0; i < 5; i++) {
    const pa = await js.publish("real.x", new TextEncoder().encode(`m${i}`));
    assert.equal(pa.stream, "REAL", "PubAck from the server's stream");
  }
  r = await cli("stream", "info", "REAL", "--json");
  assert.equal(r.code, 0);
  assert.equal(JSON.parse(r.stdout).state.messages, 5, "the server's stream stored them");

  // The API off: the bridge starts beside a real JetStream without answering it.
  const off = await st.bridge({ name: "off", config: (c) => { c.jetstream = { api: false }; } }).tryStart(20_000);
  assert.equal(off.healthy, true, `jetstream.api false starts: ${off.output || ""}`);
  r = await cli("stream", "ls", "--names");
  assert.deepEqual(r.stdout.split(/\s+/).filter(Boolean), ["REAL"]);
  await b.stop();
}, { timeout: 660_000 }); // the first run builds the CLI: 40-90 s on a quiet machine, minutes under load
