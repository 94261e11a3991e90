// e2e_go_client_compat: the Go client (nats.go 1.22.1 from Debian, golang-github-nats-io-go-nats-dev)
// against the bridge: js.Publish PubAcks, Metadata() of every delivery (stream, consumer,
// delivered, stream seq, timestamp within 1 s of the publish, also on a redelivery 1.5 s later),
// Ack, AckSync (nil within 1 s), Nak, NakWithDelay, InProgress (keeps a message past ack_wait)
// and Term (dead letter). The checks live in tests/e2e/go/compat/main.go; this test builds it
// offline (GOPATH mode over /usr/share/gocode: no module download) and requires exit 0.
// Also here: e2e_ack_request_replies (acks sent as requests, with the npm client).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { test } from "./lib/runner.mjs";
import { startStack, runCmd, BUILD, TOOLS, waitFor, SLOW } from "./lib/stack.mjs";
import { natsConnect, makeMsg, Consumer, publishAcked, sc, waitBacklog } from "./lib/client.mjs";
import { assert } from "./lib/check.mjs";

const HERE = path.dirname(fileURLToPath(import.meta.url));

/** Build tests/e2e/go/<name> into BUILD/tests/e2e/go-<name>; returns the binary's path. */
export async function buildGo(name) {
  const src = path.join(HERE, "go", name);
  const out = path.join(BUILD, "tests", "e2e", `go-${name}`);
  fs.mkdirSync(path.dirname(out), { recursive: true });
  const env = {
    ...process.env,
    GO111MODULE: "off", // GOPATH mode: imports come from the Debian packages' source tree
    GOPATH: "/usr/share/gocode",
    GOCACHE: path.join(TOOLS, "go-cache"), // shared by every build dir (Go's cache takes concurrent builds)
    GOPROXY: "off",
    GOFLAGS: "",
  };
  const r = await new Promise((resolve) => {
    import("node:child_process").then(({ execFile }) => {
      execFile("go", ["build", "-o", out, "."], { cwd: src, env, timeout: 180_000 }, (err, stdout, stderr) =>
        resolve({ err, stdout, stderr }));
    });
  });
  if (r.err) throw new Error(`go build of ${name} failed (scripts/install-deps.sh installs golang-go and golang-github-nats-io-go-nats-dev): ${r.err.message}\n${r.stderr}`);
  return out;
}

test("e2e_go_client_compat", async (ctx) => {
  const bin = await buildGo("compat");
  const st = await startStack(ctx);
  const bridge = await st.bridge({ name: "goc", defaults: { ack_wait: "2s", backoff: ["200ms"] } }).start();
  const t0 = Date.now();
  const r = await runCmd(bin, ["-url", st.nats.url, "-channel", "orders", "-capture", "orders.go",
    "-deliver", "q.orders", "-claim", "gocli", "-ack-wait", "2s", "-slow", String(SLOW)], { timeout: 60_000 * SLOW });
  ctx.log(`go client: exit ${r.code} after ${Date.now() - t0} ms`);
  const lines = r.stdout.split("\n").filter(Boolean);
  for (const l of lines) ctx.log(l.length > 2000 ? l.slice(0, 2000) + "..." : l);
  if (r.stderr) ctx.log(`stderr: ${r.stderr.slice(0, 2000)}`);
  const res = lines.find((l) => l.startsWith("RESULT "));
  assert.ok(res, "the Go program printed its RESULT line");
  const j = JSON.parse(res.slice(7));
  assert.deepEqual(j.failures || [], [], "nats.go expectations");
  assert.equal(r.code, 0, `go client exit ${r.code}`);
  // Every AckSync answered within its wait (1 s, times the slow-build factor).
  for (const d of j.deliveries.filter((x) => x.ack_ms)) assert.ok(d.ack_ms < 1000 * SLOW, `AckSync took ${d.ack_ms} ms (limit ${1000 * SLOW})`);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
}, { timeout: 240_000 });

// e2e_ack_request_replies: an ack sent as a request (nats.go AckSync, nats.js ackAck, or any
// request to the reply subject) gets an empty reply once applied; one that cannot be applied
// (the delivery was already acked; a body that is not an ack) gets an error reply, never silence.
test("e2e_ack_request_replies", async (ctx) => {
  const st = await startStack(ctx);
  const bridge = await st.bridge({ name: "ars", defaults: { ack_wait: "30s", backoff: ["100ms"] } }).start();
  const nc = await natsConnect(ctx, st.nats.url);
  const c = new Consumer(nc, "q.orders.sync", { ackMode: () => null });
  await nc.flush();
  for (let i = 0; i < 2; i++) assert.ok((await publishAcked(nc, makeMsg("ars", i, "orders.sync"))).ok);
  await c.waitUnique(2, 15_000);
  const [a, b] = [...c.records].sort((x, y) => x.n - y.n);
  const ask = async (reply, body) => {
    const t0 = performance.now();
    const r = await nc.request(reply, sc.encode(body), { timeout: 2000 });
    return { text: sc.decode(r.data), ms: performance.now() - t0 };
  };
  const ok = await ask(a.reply, "+ACK");
  ctx.log(`+ACK as a request: ${JSON.stringify(ok.text)} after ${ok.ms.toFixed(1)} ms`);
  assert.equal(ok.text, "", "empty reply once the ack is applied");
  const again = await ask(a.reply, "+ACK");
  ctx.log(`the same ack again: ${again.text}`);
  assert.equal(JSON.parse(again.text).error.code, 409, "an ack that is no longer applicable gets an error reply");
  const bad = await ask(b.reply, "+NOPE");
  assert.ok(JSON.parse(bad.text).error, `a body that is not an ack: ${bad.text}`);
  const nak = await ask(b.reply, "-NAK");
  assert.equal(nak.text, "", "-NAK as a request: empty reply");
  await waitFor(() => c.records.filter((r) => r.id === b.id).length >= 2, { timeout: 10_000, what: "redelivery after the NAK" });
  const b2 = c.records.filter((r) => r.id === b.id)[1];
  assert.equal((await ask(b2.reply, "+ACK")).text, "");
  await waitBacklog(nc, "orders", 0);
  assert.equal(c.records.filter((r) => r.id === a.id).length, 1, "the acked message is not redelivered");
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
});
