// check_matches_startup: every configuration that a start of fluxon-bridge refuses, --check
// refuses too, with the same exit code (2) and the same error text (the [ERR] line without its
// pid and time). Covers the file-level checks, the ones of the daemon's own setup (etcd/KV
// endpoints with credentials, NATS credential and TLS files, nkey seeds), and control characters
// in names and subjects (a "\u0000" in a name is refused, not truncated silently).
// No server is needed: every refusal happens before any connection (the endpoints are unused
// ports, so a start that were not refused would keep retrying and hit the timeout below).
import fs from "node:fs";
import path from "node:path";
import { test } from "./lib/runner.mjs";
import { bridgeRun, freePort } from "./lib/stack.mjs";
import { assert } from "./lib/check.mjs";

function errLines(out) {
  return out.split("\n").filter((l) => l.includes("[ERR]")).map((l) => l.replace(/^\[\d+\] \S+ \S+ /, ""));
}

test("check_matches_startup", async (ctx) => {
  const dead = `127.0.0.1:${await freePort()}`;
  const base = () => ({
    name: "chk",
    nats: { url: `nats://${dead}`, monitor_url: `http://${dead}` },
    etcd: { endpoints: [`http://${dead}`], prefix: "/fxchk" },
    channels: [{ name: "orders", subjects: ["orders.>"], deliver_prefix: "q.orders" }],
  });
  const cases = [];
  const add = (name, want, edit) => {
    const c = base();
    const text = edit(c);
    cases.push({ name, want, text: typeof text === "string" ? text : JSON.stringify(c) });
  };
  add("not JSON", "invalid JSON", () => "{\"name\": ");
  add("unknown key", "colour", (c) => { c.colour = "blue"; });
  add("etcd endpoint with credentials", "etcd: bad endpoint #0", (c) => { c.etcd.endpoints = [`http://root:secret@${dead}`]; });
  add("kv endpoint with credentials", "bad endpoint", (c) => { c.kv = { backend: "etcd", endpoints: [`http://root:secret@${dead}`] }; });
  add("nkey seed file", "nats.nkey_seed_file", (c) => { c.nats.nkey_seed_file = "/nonexistent/seed.nk"; });
  add("missing CA file", "nats.ca_file", (c) => { c.nats.ca_file = "/nonexistent/ca.pem"; });
  add("missing client certificate", "nats.cert_file", (c) => { c.nats.cert_file = "/nonexistent/c.pem"; c.nats.key_file = "/nonexistent/k.pem"; });
  add("NUL in a channel name", "(NUL) in a string", (c) => JSON.stringify(c).replace("\"name\":\"orders\"", "\"name\":\"or\\u0000ders\""));
  add("NUL in the bridge name", "(NUL) in a string", (c) => JSON.stringify(c).replace("\"name\":\"chk\"", "\"name\":\"chk\\u0000x\""));
  add("NUL in a subject", "(NUL) in a string", (c) => JSON.stringify(c).replace("\"orders.>\"", "\"orders.\\u0000\""));
  add("control character in a subject", "channels[0].subjects[0]", (c) => { c.channels[0].subjects = ["orders.\u0001"]; });
  add("control character in a name", "channels[0].name", (c) => { c.channels[0].name = "or\u001fders"; });

  const secret = /secret/;
  for (const k of cases) {
    const file = path.join(ctx.dir, `${k.name.replace(/\W+/g, "-")}.json`);
    fs.writeFileSync(file, k.text);
    const [chk, run] = await Promise.all([bridgeRun(["--check", "-c", file], 10_000), bridgeRun(["-c", file], 10_000)]);
    const ce = errLines(chk.stdout + chk.stderr);
    const re = errLines(run.stdout + run.stderr);
    ctx.log(`${k.name}: --check ${chk.code}, start ${run.code}${run.timedOut ? " (timed out)" : ""}: ${ce[0] || "(no error)"}`);
    assert.equal(run.code, 2, `${k.name}: start exit ${run.code}${run.timedOut ? " (timed out: not refused)" : ""}: ${(run.stdout + run.stderr).slice(-300)}`);
    assert.equal(chk.code, 2, `${k.name}: --check exit ${chk.code} while start refuses it with: ${re[0]}`);
    assert.equal(ce.length, 1, `${k.name}: one error line from --check: ${JSON.stringify(ce)}`);
    assert.deepEqual(ce, re, `${k.name}: same text`);
    assert.ok(ce[0].includes("invalid configuration") && ce[0].includes(k.want), `${k.name}: "${ce[0]}" names ${k.want}`);
    assert.ok(!secret.test(chk.stdout + chk.stderr + run.stdout + run.stderr), `${k.name}: credentials never printed`);
  }
});
