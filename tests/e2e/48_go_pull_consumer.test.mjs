// e2e_go_pull_consumer: nats.go (Debian's 1.22, unchanged client code) pull consumers through
// the bridge: js.AddConsumer stores a durable (ack_wait 2s, max_deliver 3); two workers
// js.PullSubscribe (bound to it) + Fetch(10) + Ack get each of 40 messages exactly once, none
// redelivered after ack_wait; Nak / NakWithDelay / InProgress / Term behave as on JetStream and a
// message NAKed max_deliver times reaches the dead-letter channel (never a 4th delivery). The
// checks live in tests/e2e/go/pull/main.go (built offline, GOPATH mode, like e2e_go_client_compat).
import { test } from "./lib/runner.mjs";
import { startStack, runCmd, SLOW } from "./lib/stack.mjs";
import { buildGo } from "./14_go_client_compat.test.mjs";
import { assert } from "./lib/check.mjs";

test("e2e_go_pull_consumer", async (ctx) => {
  const bin = await buildGo("pull");
  const st = await startStack(ctx);
  const bridge = await st.bridge({ name: "gop", defaults: { backoff: ["100ms"] } }).start();
  const t0 = Date.now();
  const r = await runCmd(bin, ["-url", st.nats.url, "-channel", "orders", "-capture", "orders.gopull",
    "-dlq", "q.orders-dlq", "-consumer", "gopull", "-slow", String(SLOW)], { timeout: 120_000 * SLOW });
  ctx.log(`go pull client: exit ${r.code} after ${Date.now() - t0} ms`);
  for (const l of r.stdout.split("\n").filter(Boolean)) ctx.log(l.length > 2000 ? l.slice(0, 2000) + "..." : l);
  if (r.stderr) ctx.log(`stderr: ${r.stderr.slice(0, 2000)}`);
  const res = r.stdout.split("\n").find((l) => l.startsWith("RESULT "));
  assert.ok(res, "the Go program printed its RESULT line");
  const j = JSON.parse(res.slice(7));
  assert.deepEqual(j.failures || [], [], "nats.go pull expectations");
  assert.equal(r.code, 0, `go client exit ${r.code}`);
  const ex = await bridge.stop();
  assert.equal(ex.code, 0, `bridge exit ${JSON.stringify(ex)}`);
  bridge.assertLogClean();
}, { timeout: 300_000 });
