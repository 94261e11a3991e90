// stack.mjs -- real processes for the end-to-end tests: etcd, nats-server, fluxon-bridge and
// fluxonctl, on free loopback ports, with pidfiles under the temp root (tests/run.sh kills
// leftovers from them), logs captured to files, bounded waits (polling with deadlines, never a
// fixed sleep for synchronisation) and a SIGTERM -> SIGKILL stop. Every process is registered
// with the test context, so it is stopped when the test ends, and with a process-wide set, so it
// is killed when the runner exits for any reason. When the runner is SIGKILLed no exit handler
// runs: then the subreaper the runner runs under (tests/e2e/reap/fxt_reap.c, started by
// tests/e2e/run.sh) kills what it left.

import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { setTimeout as delay } from "node:timers/promises";
import { throwIfAborted } from "./context.mjs";

export const BUILD = process.env.FXE2E_BUILD || path.resolve(process.cwd(), "build");
export const BRIDGE_BIN = path.join(BUILD, "fluxon-bridge");
export const CTL_BIN = path.join(BUILD, "fluxonctl");
const REPO = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..", "..", "..");
/** What the tests build that does not depend on how the bridge is built (the nats CLI, Go's build
 * cache): one place for every build dir, so make test, make check and make tsan build it once. */
export const TOOLS = process.env.FXE2E_TOOLS || path.join(REPO, "build-tools");

/**
 * The slow-build factor, one for the whole suite (C tests read the same FXT_SLOW through
 * tests/support/fxt_slow.h): every bounded wait and every time bound a test asserts is multiplied
 * by it. tests/run.sh sets FXT_SLOW from its --slow option (the Makefile: 1 for make test, more
 * for make check, tsan, valgrind); run directly, FXT_SANITIZED=1 means 3. FXE2E_SLOW is the old
 * name of the same knob.
 */
export const SLOW = Math.max(1, Number(process.env.FXE2E_SLOW || process.env.FXT_SLOW || (process.env.FXT_SANITIZED ? 3 : 1)) || 1);
/** How much a consumer's view of a rate-limited publisher's spacing may shrink: each message
 * reaches it after its store batch commits and a delivery round, and that latency varies from
 * batch to batch (seen: 85 ms on a quiet machine). 300 ms, times the slow factor, at most 700:
 * a publisher that ignored its rate still lands far below any bound built with it. */
export const REDRIVE_JITTER_MS = Math.min(700, 300 * SLOW);

/** Sanitizer reports in a log (ASan, LSan, TSan, UBSan). */
export const SANITIZER_RE = /ERROR: (Address|Leak|Thread|Memory)Sanitizer|WARNING: ThreadSanitizer|ThreadSanitizer: reported|runtime error:/;
/** The exit code the Makefile's sanitizer runs give a process with a report (exitcode=66). */
export const SANITIZER_EXIT = 66;

let ROOT = null;
export function setRoot(dir) {
  ROOT = dir;
}
export function root() {
  return ROOT;
}

// ---------------------------------------------------------------------------------------------
// Waiting

/**
 * Poll `probe` (sync or async) until it returns a truthy value, which is returned. Throws after
 * `timeout` ms with `what` and the last value or error. `interval` is the polling period. An error
 * with `fatal` set that the probe throws ends the wait at once.
 */
export async function waitFor(probe, { timeout = 10_000, interval = 50, what = "condition" } = {}) {
  timeout *= SLOW;
  const deadline = Date.now() + timeout;
  let last;
  let lastErr;
  for (;;) {
    throwIfAborted(); // the test this wait belongs to timed out: stop waiting
    try {
      last = await probe();
      lastErr = undefined;
      if (last) return last;
    } catch (e) {
      if (e && e.fatal) throw e; // no point in waiting any longer
      lastErr = e;
    }
    if (Date.now() >= deadline) {
      const detail = lastErr ? `last error: ${lastErr.message || lastErr}` : `last value: ${fmt(last)}`;
      throw new Error(`timed out after ${timeout} ms waiting for ${typeof what === "function" ? what() : what} (${detail})`);
    }
    await delay(interval);
  }
}

function fmt(v) {
  try {
    const s = typeof v === "string" ? v : JSON.stringify(v);
    return s && s.length > 300 ? s.slice(0, 300) + "..." : s;
  } catch {
    return String(v);
  }
}

// ---------------------------------------------------------------------------------------------
// Ports

const handedOut = new Set();

// The kernel's ephemeral range (outgoing connections take their local port from it): ports are
// picked below it, so a client connection of this or another process cannot take a port between
// the pick and the server's bind. What remains (another test run picking the same port) is met by
// the start-up retries: a server that exits with "address already in use" is started again, on
// fresh ports for a first start, on the same port (it must keep it) after a bounded wait for a
// restart.
function ephemeralLow() {
  try {
    const [lo] = fs.readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/).map(Number);
    if (lo > 12_000) return lo;
  } catch {
    /* not Linux: fall through */
  }
  return 32_768;
}
const PORT_LO = 10_000;
const PORT_HI = ephemeralLow() - 1;

function canBind(port) {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.unref();
    srv.once("error", () => resolve(false));
    srv.listen(port, "127.0.0.1", () => srv.close(() => resolve(true)));
  });
}

// The fetch standard's "bad ports" in our range: Node's fetch refuses them ("fetch failed"
// before any connect). A bridge whose HTTP port was 10080 never looked healthy (seen in make tsan).
const FETCH_BAD_PORTS = new Set([10080]);

/** A free TCP port on 127.0.0.1 below the ephemeral range, never the same one twice in this run. */
export async function freePort() {
  for (let i = 0; i < 200; i++) {
    const port = PORT_LO + Math.floor(Math.random() * (PORT_HI - PORT_LO + 1));
    if (handedOut.has(port) || FETCH_BAD_PORTS.has(port)) continue;
    if (await canBind(port)) {
      handedOut.add(port);
      return port;
    }
  }
  throw new Error("no free port");
}

/** Did the log say a listener could not bind (EADDRINUSE)? */
export function addrInUse(text) {
  return /address already in use|EADDRINUSE|Only one usage of each socket address|Could not create server TCP listening socket/i.test(text);
}

// ---------------------------------------------------------------------------------------------
// HTTP

/** GET url; returns {status, text, json} (json null if the body is not JSON). */
export async function httpGet(url, timeout = 3000) {
  const res = await fetch(url, { signal: AbortSignal.timeout(timeout) });
  const text = await res.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return { status: res.status, text, json };
}

// ---------------------------------------------------------------------------------------------
// Processes

const live = new Set();
const PDEATHSIG = process.env.FXE2E_PDEATHSIG === "1";

function killAllSync() {
  for (const p of live) {
    try {
      process.kill(p.pid, "SIGCONT");
      process.kill(p.pid, "SIGKILL");
    } catch {
      /* gone */
    }
    try {
      fs.unlinkSync(p.pidfile);
    } catch {
      /* none */
    }
  }
  live.clear();
}

let handlersInstalled = false;
/** Kill every child on exit, SIGINT or SIGTERM; cleanupRoot removes our own temp root. */
export function installExitHandlers(cleanupRoot) {
  if (handlersInstalled) return;
  handlersInstalled = true;
  process.on("exit", () => {
    killAllSync();
    if (cleanupRoot) cleanupRoot();
  });
  for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) {
    process.on(sig, () => {
      console.log(`e2e: caught ${sig}, killing children`);
      killAllSync();
      process.exit(sig === "SIGINT" ? 130 : 143);
    });
  }
}

export class Proc {
  /**
   * Start `cmd args` with stdout and stderr appended to logPath; writes <root>/<tag>.pid.
   * inheritFds: N extra descriptors (/dev/null, read-only) the child inherits at fds 3..N+2, so
   * it holds that many from its first instruction (descriptor pressure without a test hook).
   */
  constructor(tag, cmd, args, { logPath, cwd, env, inheritFds = 0 } = {}) {
    this.tag = tag;
    this.cmd = cmd;
    this.args = args;
    this.logPath = logPath;
    this.pidfile = path.join(ROOT, `${tag}-${process.pid}-${Proc.seq++}.pid`);
    const fd = fs.openSync(logPath, "a");
    this.logFrom = fs.fstatSync(fd).size; // where this run's lines start in the log
    fs.writeSync(fd, `---- ${new Date().toISOString()} start: ${cmd} ${args.join(" ")}\n`);
    const extra = inheritFds > 0 ? fs.openSync("/dev/null", "r") : null;
    const stdio = ["ignore", fd, fd, ...Array(inheritFds).fill(extra)];
    // FXE2E_PDEATHSIG=1 (the chaos runner): the child is exec'd by setpriv with a parent-death
    // signal, so it dies with the runner even when the runner itself is killed with SIGKILL.
    const [c0, a0] = PDEATHSIG ? ["setpriv", ["--pdeathsig", "KILL", "--", cmd, ...args]] : [cmd, args];
    try {
      this.child = spawn(c0, a0, { stdio, cwd, env: env || process.env });
    } finally {
      fs.closeSync(fd);
      if (extra !== null) fs.closeSync(extra);
    }
    this.pid = this.child.pid;
    this.exit = null; // {code, signal}
    this.exited = new Promise((resolve) => {
      this.child.on("exit", (code, signal) => {
        this.exit = { code, signal };
        live.delete(this);
        try {
          fs.unlinkSync(this.pidfile);
        } catch {
          /* none */
        }
        resolve(this.exit);
      });
      this.child.on("error", (e) => {
        this.exit = { code: 127, signal: null, error: e };
        live.delete(this);
        resolve(this.exit);
      });
    });
    if (this.pid) {
      fs.writeFileSync(this.pidfile, `${this.pid}\n`);
      live.add(this);
    }
  }
  get running() {
    return this.exit === null;
  }
  signal(sig) {
    if (this.running) {
      try {
        process.kill(this.pid, sig);
      } catch {
        /* already gone */
      }
    }
  }
  /** Wait for exit within timeout ms; returns the exit or null. */
  async waitExit(timeout) {
    if (!this.running) return this.exit;
    let t;
    const r = await Promise.race([this.exited, new Promise((res) => (t = setTimeout(() => res(null), timeout)))]);
    clearTimeout(t);
    return r;
  }
  /** SIGTERM (or sig), wait up to timeout, then SIGKILL. Returns {code, signal, killed}. */
  async stop({ sig = "SIGTERM", timeout = 10_000 } = {}) {
    if (!this.running) return { ...this.exit, killed: false };
    this.signal("SIGCONT");
    this.signal(sig);
    const r = await this.waitExit(timeout);
    if (r) return { ...r, killed: false };
    this.signal("SIGKILL");
    const r2 = await this.waitExit(10_000);
    return { ...(r2 || { code: null, signal: "SIGKILL" }), killed: true };
  }
  async kill9() {
    return this.stop({ sig: "SIGKILL", timeout: 10_000 });
  }
  /** The last `lines` lines of the log; with `filter` (a RegExp) only lines matching it. */
  logTail(lines = 40, filter = null) {
    try {
      let all = fs.readFileSync(this.logPath, "utf8").split("\n");
      if (filter) all = all.filter((l) => filter.test(l));
      return all.slice(-lines - 1).join("\n");
    } catch (e) {
      return `(no log: ${e.message})`;
    }
  }
  log() {
    try {
      return fs.readFileSync(this.logPath, "utf8");
    } catch {
      return "";
    }
  }
  /** This run's part of the log (a log file is shared by the restarts of one server). */
  runLog() {
    return this.log().slice(this.logFrom || 0);
  }
}
Proc.seq = 0;

/** Pause before starting a server again on a port some other process holds (restart retries). */
async function portRetryPause(attempt) {
  await delay(300 * (attempt + 1));
}

/** Start server srv by srv.startOnce(), retrying twice when its port was taken between the pick
 * and the bind: pick() picks ports when it has none and says whether they are fresh (a first
 * start: forget() drops them and the retry picks new ones); a restart keeps its ports (its
 * clients know them) and retries after a pause. */
async function startRetryingPorts(srv, what, pick, forget) {
  for (let attempt = 0; ; attempt++) {
    const fresh = await pick();
    try {
      await srv.startOnce();
      return srv;
    } catch (e) {
      if (srv.proc) await srv.proc.stop({ timeout: 2000 });
      if (attempt < 2 && srv.proc && addrInUse(srv.proc.runLog())) {
        srv.ctx.log(`${srv.name}: ${what} in use, retrying on ${fresh ? `fresh ${what}` : `the same ${what}`} (${attempt + 1})`);
        if (fresh) forget();
        else await portRetryPause(attempt);
        continue;
      }
      throw e;
    }
  }
}

/** Run a command to completion (bounded); returns {code, signal, stdout, stderr}. */
export function runCmd(cmd, args, { timeout = 20_000, input } = {}) {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { stdio: ["pipe", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    let timedOut = false;
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    const t = setTimeout(() => {
      timedOut = true;
      child.kill("SIGKILL");
    }, timeout);
    child.on("error", (e) => {
      clearTimeout(t);
      resolve({ code: 127, signal: null, stdout, stderr: stderr + String(e), timedOut });
    });
    child.on("close", (code, signal) => {
      clearTimeout(t);
      resolve({ code, signal, stdout, stderr, timedOut });
    });
    if (input !== undefined) child.stdin.end(input);
    else child.stdin.end();
  });
}

// ---------------------------------------------------------------------------------------------
// etcd

export class Etcd {
  constructor(ctx, name = "etcd") {
    this.ctx = ctx;
    this.name = name;
    this.dir = path.join(ctx.dir, name);
    this.proc = null;
  }
  get url() {
    return `http://127.0.0.1:${this.clientPort}`;
  }
  async start() {
    for (let attempt = 0; attempt < 3; attempt++) {
      if (!this.clientPort) {
        this.clientPort = await freePort();
        this.peerPort = await freePort();
      }
      const fresh = !fs.existsSync(path.join(this.dir, "member"));
      fs.mkdirSync(this.dir, { recursive: true });
      const client = `http://127.0.0.1:${this.clientPort}`;
      const peer = `http://127.0.0.1:${this.peerPort}`;
      this.proc = new Proc(`${this.ctx.name}-${this.name}`, "etcd", [
        `--name=${this.name}`,
        `--data-dir=${path.join(this.dir, "data")}`,
        `--listen-client-urls=${client}`,
        `--advertise-client-urls=${client}`,
        `--listen-peer-urls=${peer}`,
        `--initial-advertise-peer-urls=${peer}`,
        `--initial-cluster=${this.initialCluster || `${this.name}=${peer}`}`,
        `--initial-cluster-state=${fresh ? "new" : "existing"}`,
        "--logger=zap",
        "--log-level=warn",
      ], { logPath: path.join(this.ctx.dir, `${this.name}.log`) });
      if (!this._registered) {
        this._registered = true;
        this.ctx.defer(() => this.stop());
        this.ctx.onFailure(() => `---- ${this.name} log (warnings and errors, last 10):\n${this.proc ? this.proc.logTail(10, /"level":"(warn|error|fatal|panic)"|^----/) : ""}`);
      }
      try {
        await waitFor(async () => {
          if (!this.proc.running) throw new Error(`etcd exited: ${JSON.stringify(this.proc.exit)}`);
          const r = await httpGet(`${client}/health`, 1000);
          return r.status === 200 && r.json && r.json.health === "true";
        }, { timeout: 20_000, what: "etcd /health" });
        return this;
      } catch (e) {
        await this.proc.stop({ timeout: 2000 });
        if (fresh && attempt < 2 && !this.initialCluster) {
          // a port race: try fresh ports
          this.clientPort = null;
          fs.rmSync(this.dir, { recursive: true, force: true });
          continue;
        }
        if (attempt < 2 && addrInUse(this.proc.runLog())) {
          // a restart must keep its ports: wait for the other holder to let go, then again
          this.ctx.log(`${this.name}: port in use on restart, retrying (${attempt + 1})`);
          await portRetryPause(attempt);
          continue;
        }
        throw new Error(`etcd did not start: ${e.message}\n${this.proc.logTail(20)}`);
      }
    }
    throw new Error("etcd did not start");
  }
  async stop() {
    if (this.proc) await this.proc.stop({ timeout: 5000 });
  }
  async restart() {
    await this.stop();
    return this.start();
  }

  /** {memberId, leader} of this member (POST /v3/maintenance/status), ids as decimal strings. */
  async status() {
    const res = await fetch(`${this.url}/v3/maintenance/status`, { method: "POST", body: "{}", signal: AbortSignal.timeout(2000) });
    if (res.status !== 200) throw new Error(`etcd ${this.name} status: HTTP ${res.status}`);
    const j = await res.json();
    return { memberId: String(j.header.member_id), leader: String(j.leader) };
  }

  /** Freeze etcd (SIGSTOP): an outage in which connections stay open but nothing answers. */
  pause() {
    if (this.proc) this.proc.signal("SIGSTOP");
  }
  /** Undo pause() (SIGCONT). stop() also sends SIGCONT first, so a paused etcd is torn down. */
  resume() {
    if (this.proc) this.proc.signal("SIGCONT");
  }

  /**
   * A lease's state (POST /v3/lease/timetolive): {id, ttl (remaining s, -1 when the lease does
   * not exist), grantedTTL (s), keys: [string]}. id is a decimal string (lease ids exceed 2^53).
   */
  async leaseInfo(id) {
    const res = await fetch(`${this.url}/v3/lease/timetolive`, {
      method: "POST",
      body: JSON.stringify({ ID: String(id), keys: true }),
      signal: AbortSignal.timeout(3000),
    });
    if (res.status !== 200) throw new Error(`etcd lease timetolive ${id}: HTTP ${res.status}`);
    const j = await res.json();
    return {
      id: String(id),
      ttl: Number(j.TTL ?? -1),
      grantedTTL: Number(j.grantedTTL ?? 0),
      keys: (j.keys || []).map((k) => Buffer.from(k, "base64").toString()),
    };
  }

  /** Range over a key prefix: [{key, value, lease}] (value as a utf8 string). */
  async range(prefix) {
    const b64 = (s) => Buffer.from(s).toString("base64");
    const end = Buffer.from(prefix);
    end[end.length - 1] += 1;
    const res = await fetch(`${this.url}/v3/kv/range`, {
      method: "POST",
      body: JSON.stringify({ key: b64(prefix), range_end: end.toString("base64") }),
      signal: AbortSignal.timeout(3000),
    });
    if (res.status !== 200) throw new Error(`etcd range ${prefix}: HTTP ${res.status}`);
    const j = await res.json();
    return (j.kvs || []).map((kv) => ({
      key: Buffer.from(kv.key, "base64").toString(),
      value: kv.value ? Buffer.from(kv.value, "base64").toString() : "",
      lease: kv.lease || "0",
    }));
  }
}

// ---------------------------------------------------------------------------------------------
// nats-server

export class NatsServer {
  /** opts.maxPayload: bytes (written into a config file). opts.jetstream: JetStream on (off by default). */
  constructor(ctx, name = "nats", opts = {}) {
    this.ctx = ctx;
    this.name = name;
    this.opts = opts;
    this.proc = null;
  }
  get url() {
    return `nats://127.0.0.1:${this.port}`;
  }
  get monitorUrl() {
    return `http://127.0.0.1:${this.monitorPort}`;
  }
  /** The leafnode listener the bridge delivers through (true $JS.ACK. reply subjects). */
  get leafUrl() {
    return `nats://127.0.0.1:${this.leafPort}`;
  }
  async start() {
    return startRetryingPorts(this, "ports", async () => {
      if (this.port) return false;
      this.port = await freePort();
      this.monitorPort = await freePort();
      this.leafPort = await freePort();
      return !this.opts.cluster; // a cluster member's route port is known to the others
    }, () => { this.port = null; });
  }
  async startOnce() {
    const conf = path.join(this.ctx.dir, `${this.name}.conf`);
    const lines = [
      `listen: "127.0.0.1:${this.port}"`,
      `http: "127.0.0.1:${this.monitorPort}"`,
      this.opts.jetstream ? `jetstream { store_dir: "${path.join(this.ctx.dir, `${this.name}-js`)}" }` : "jetstream: disabled",
      `leafnodes { listen: "127.0.0.1:${this.leafPort}" }`,
    ];
    if (this.opts.maxPayload) lines.push(`max_payload: ${this.opts.maxPayload}`);
    if (this.opts.cluster) { // {name, port, routes: [ports of every member]} (startNatsCluster)
      const c = this.opts.cluster;
      lines.push(`server_name: ${this.name}`);
      lines.push(`cluster { name: ${c.name}, listen: "127.0.0.1:${c.port}", routes: [${c.routes.map((p) => `"nats-route://127.0.0.1:${p}"`).join(", ")}] }`);
    }
    fs.writeFileSync(conf, lines.join("\n") + "\n");
    this.proc = new Proc(`${this.ctx.name}-${this.name}`, "nats-server", ["-c", conf], {
      logPath: path.join(this.ctx.dir, `${this.name}.log`),
    });
    if (!this._registered) {
      this._registered = true;
      this.ctx.defer(() => this.stop());
      this.ctx.onFailure(() => `---- ${this.name} log (warnings and errors, last 10):\n${this.proc ? this.proc.logTail(10, /\[(WRN|ERR|FTL)\]|^----/) : ""}`);
    }
    await waitFor(async () => {
      if (!this.proc.running) {
        const e = new Error(`nats-server exited: ${JSON.stringify(this.proc.exit)}`);
        e.fatal = true;
        throw e;
      }
      const r = await httpGet(`${this.monitorUrl}/healthz`, 1000);
      return r.status === 200;
    }, { timeout: 20_000, what: "nats-server /healthz" });
  }
  async stop() {
    if (this.proc) await this.proc.stop({ timeout: 5000 });
  }
  async restart() {
    await this.stop();
    return this.start();
  }
}

/**
 * An etcd cluster of n members on loopback ports, started together (each waits for quorum).
 * Returns the members; urls: every client URL (for a bridge's etcd.endpoints).
 */
export async function startEtcdCluster(ctx, n = 3) {
  const members = Array.from({ length: n }, (_, i) => new Etcd(ctx, `etcd-${i + 1}`));
  for (const m of members) {
    m.clientPort = await freePort();
    m.peerPort = await freePort();
  }
  const initial = members.map((m) => `${m.name}=http://127.0.0.1:${m.peerPort}`).join(",");
  for (const m of members) m.initialCluster = initial;
  await Promise.all(members.map((m) => m.start()));
  return members;
}

/** The member that is the leader now (asked of the first member that answers). */
export async function etcdLeader(members) {
  for (const m of members) {
    if (!m.proc || !m.proc.running) continue;
    try {
      const st = await m.status();
      for (const x of members) if (x.proc && x.proc.running && (await x.status()).memberId === st.leader) return x;
    } catch {
      /* this member does not answer: ask the next */
    }
  }
  return null;
}

/**
 * n nats-servers in one cluster (routes between all of them, loopback ports), started and
 * waited for until every server has a route to every other one.
 */
export async function startNatsCluster(ctx, n = 3, name = "c1") {
  const ports = [];
  for (let i = 0; i < n; i++) ports.push(await freePort());
  const servers = ports.map((port, i) => new NatsServer(ctx, `nats-${String.fromCharCode(97 + i)}`, { cluster: { name, port, routes: ports } }));
  await Promise.all(servers.map((s) => s.start()));
  for (const s of servers) {
    let routes = -1;
    await waitFor(async () => {
      const r = await httpGet(`${s.monitorUrl}/routez`, 1000);
      routes = r.json ? r.json.num_routes : -1;
      return routes >= n - 1;
    }, { timeout: 20_000, what: () => `${s.name}: ${n - 1} routes (have ${routes})` });
  }
  return servers;
}

// ---------------------------------------------------------------------------------------------
// redis-server (the Redis payload plane)

export class Redis {
  /** opts.appendfsync: "always" | "everysec" | "no" (AOF on); null/undefined: no AOF, no RDB.
   *  opts.args: more redis-server arguments (e.g. ["--maxmemory", "4mb"]). */
  constructor(ctx, name = "redis", opts = {}) {
    this.ctx = ctx;
    this.name = name;
    this.opts = opts;
    this.dir = path.join(ctx.dir, name);
    this.proc = null;
  }
  get url() {
    return `redis://127.0.0.1:${this.port}`;
  }
  /** Start (again: same port and dir, so it reloads its AOF) and wait for PONG. */
  async start() {
    return startRetryingPorts(this, "port", async () => {
      if (this.port) return false;
      this.port = await freePort();
      return true;
    }, () => { this.port = null; });
  }
  async startOnce() {
    fs.mkdirSync(this.dir, { recursive: true });
    const fsync = this.opts.appendfsync;
    this.proc = new Proc(`${this.ctx.name}-${this.name}`, "redis-server", [
      "--port", String(this.port), "--bind", "127.0.0.1", "--dir", this.dir, "--save", "",
      "--appendonly", fsync ? "yes" : "no", "--appendfsync", fsync || "everysec",
      "--daemonize", "no", "--protected-mode", "no", ...(this.opts.args || []),
    ], { logPath: path.join(this.ctx.dir, `${this.name}.log`) });
    if (!this._registered) {
      this._registered = true;
      this.ctx.defer(() => this.stop());
    }
    await waitFor(async () => {
      if (!this.proc.running) {
        const e = new Error(`redis-server exited: ${JSON.stringify(this.proc.exit)}\n${this.proc.logTail(10)}`);
        e.fatal = true;
        throw e;
      }
      const r = await this.cli(["PING"]).catch(() => null);
      return r && r.stdout.trim() === "PONG";
    }, { timeout: 20_000, what: "redis-server PONG" });
  }
  async stop() {
    if (this.proc) await this.proc.stop({ timeout: 5000 });
  }
  /** SIGKILL: a crash (no shutdown save). */
  async kill9() {
    return this.proc.kill9();
  }
  /** redis-cli against this server; {code, stdout, stderr}. */
  cli(args, timeout = 5000) {
    return runCmd("redis-cli", ["-h", "127.0.0.1", "-p", String(this.port), ...args], { timeout });
  }
}

/** Bridge config edit for the Redis plane (kv.backend "redis"). */
export function redisPlane(redis, extra = {}) {
  return (cfg) => {
    cfg.kv = { backend: "redis", url: redis.url, ...extra };
  };
}

// ---------------------------------------------------------------------------------------------
// fluxon-bridge

export const DEFAULTS = {
  ttl_seconds: 5,
  capacity: 100000,
  ack: "explicit",
  ack_wait: "30s",
  max_deliver: 5,
  max_ack_pending: 1000,
  backoff: ["200ms"],
  release_after: "1s",
  interest_poll: "200ms",
};

export const ORDERS = { name: "orders", subjects: ["orders.>"], deliver_prefix: "q.orders" };

/** Bridges deliver through the server's leafnode listener (true $JS.ACK. reply subjects), as
 * deployed; a test may pass leaf: false to exercise the $FLUXON.ACK. client-connection path. */
export const LEAF_DEFAULT = true;

/** The config object of a bridge (deploy/README.md "Configuration fields"). leaf: set nats.leaf_url. */
export function bridgeConfig({ name, nats, etcd, httpPort, prefix, defaults = {}, channels = [ORDERS], leaf = true }) {
  return {
    name,
    nats: { url: nats.url, monitor_url: nats.monitorUrl, account: "$G", ...(leaf ? { leaf_url: nats.leafUrl } : {}) },
    etcd: { endpoints: [etcd.url], prefix },
    kv: { backend: "etcd", endpoints: [etcd.url] },
    http: { listen: `127.0.0.1:${httpPort}` },
    defaults: { ...DEFAULTS, ...defaults },
    channels,
  };
}

export function requireBinaries() {
  for (const b of [BRIDGE_BIN, CTL_BIN]) {
    if (!fs.existsSync(b)) throw new Error(`${b} is not built (set BUILD, run make)`);
  }
}

export class Bridge {
  /**
   * opts: name, nats (NatsServer), etcd (Etcd), prefix (etcd root), defaults, channels, config
   * (a function that may edit the config object before it is written), inheritFds (descriptors
   * the process starts with, see Proc).
   */
  constructor(ctx, opts) {
    this.ctx = ctx;
    this.opts = opts;
    this.name = opts.name || "b1";
    this.proc = null;
    this.starts = 0;
  }
  get healthUrl() {
    return `http://127.0.0.1:${this.httpPort}/healthz`;
  }
  get metricsUrl() {
    return `http://127.0.0.1:${this.httpPort}/metrics`;
  }
  async writeConfig() {
    if (!this.httpPort) this.httpPort = await freePort();
    const cfg = bridgeConfig({
      name: this.name,
      nats: this.opts.nats,
      etcd: this.opts.etcd,
      httpPort: this.httpPort,
      prefix: this.opts.prefix || "/fxe2e",
      defaults: this.opts.defaults,
      channels: this.opts.channels,
      leaf: this.opts.leaf ?? LEAF_DEFAULT,
    });
    if (this.opts.config) this.opts.config(cfg);
    this.configPath = path.join(this.ctx.dir, `bridge-${this.name}.json`);
    fs.writeFileSync(this.configPath, JSON.stringify(cfg, null, 2));
    return cfg;
  }
  /** Start and wait until /healthz is 200 (deadline 20 s). */
  async start() {
    requireBinaries();
    for (let attempt = 0; ; attempt++) {
      const fresh = !this.httpPort;
      await this.writeConfig();
      this.starts++;
      this.proc = new Proc(`${this.ctx.name}-bridge-${this.name}`, BRIDGE_BIN, ["-c", this.configPath], {
        logPath: path.join(this.ctx.dir, `bridge-${this.name}.log`),
        inheritFds: this.opts.inheritFds || 0,
      });
      this.register();
      try {
        await this.waitHealthy(20_000);
        return this;
      } catch (e) {
        if (attempt < 2 && !this.proc.running && addrInUse(this.proc.runLog())) {
          // the HTTP port was taken between the pick and the bind: a fresh port for a first
          // start, the same one after a pause for a restart (its clients know it)
          this.ctx.log(`bridge ${this.name}: HTTP port ${this.httpPort} in use, retrying (${attempt + 1})`);
          if (fresh) this.httpPort = null;
          else await portRetryPause(attempt);
          continue;
        }
        throw e;
      }
    }
  }
  /** First start: stop it when the test ends, dump its log on failure. Every run: a sanitizer
   * report in its output fails the test, whenever the process ends. */
  register() {
    if (!this._registered) {
      this._registered = true;
      this.ctx.defer(() => this.stop());
      this.ctx.onFailure(() => `---- bridge ${this.name} log tail (${this.proc.logPath}):\n${this.proc.logTail(40)}`);
    }
    const proc = this.proc;
    proc.exited.then((exit) => {
      const log = proc.runLog();
      const at = log.search(SANITIZER_RE);
      if (at >= 0) {
        this.ctx.fail(new Error(`sanitizer report from bridge ${this.name}:\n${log.slice(Math.max(0, at - 200), at + 3000)}`));
      } else if (exit && exit.code === SANITIZER_EXIT) {
        this.ctx.fail(new Error(`bridge ${this.name} exited with ${SANITIZER_EXIT}, the sanitizers' exit code (TSAN_OPTIONS/ASAN_OPTIONS exitcode): a report went elsewhere? log tail:\n${proc.logTail(20)}`));
      }
    });
  }
  /**
   * Start a run that may be refused: resolves {healthy: true} once /healthz is ok (the bridge
   * keeps running, like start()), or {healthy: false, exit, output} when the process exits first
   * (output: this run's log lines). Throws if neither happens within `timeout` ms.
   */
  async tryStart(timeout = 20_000) {
    requireBinaries();
    await this.writeConfig();
    this.starts++;
    const logPath = path.join(this.ctx.dir, `bridge-${this.name}.log`);
    let from = 0;
    try {
      from = fs.statSync(logPath).size;
    } catch {
      /* first run */
    }
    this.proc = new Proc(`${this.ctx.name}-bridge-${this.name}`, BRIDGE_BIN, ["-c", this.configPath], { logPath });
    this.register();
    const proc = this.proc;
    const r = await waitFor(async () => {
      if (!proc.running) return { healthy: false, exit: proc.exit };
      const h = await httpGet(this.healthUrl, 1000).catch(() => null);
      return h && h.status === 200 && h.json && h.json.status === "ok" ? { healthy: true } : null;
    }, { timeout, what: `bridge ${this.name}: healthy or exited` });
    if (!r.healthy) r.output = proc.log().slice(from);
    return r;
  }
  async waitHealthy(timeout = 20_000) {
    await waitFor(async () => {
      if (!this.proc.running) {
        // fatal: no point in waiting for a process that is gone; say why it went
        const e = new Error(`fluxon-bridge ${this.name} exited: ${JSON.stringify(this.proc.exit)}; last lines:\n${this.proc.logTail(5)}`);
        e.fatal = true;
        throw e;
      }
      const r = await httpGet(this.healthUrl, 1000);
      return r.status === 200 && r.json && r.json.status === "ok";
    }, { timeout, what: `bridge ${this.name} /healthz ok` });
  }
  async health() {
    return httpGet(this.healthUrl, 2000);
  }
  async metrics() {
    const r = await httpGet(this.metricsUrl, 3000);
    if (r.status !== 200) throw new Error(`/metrics: HTTP ${r.status}`);
    return parseMetrics(r.text);
  }
  async metricsText() {
    return (await httpGet(this.metricsUrl, 3000)).text;
  }
  /** SIGTERM and wait (deadline); returns the exit {code, signal, killed}. */
  async stop({ timeout = 20_000 } = {}) {
    if (!this.proc) return null;
    return this.proc.stop({ timeout });
  }
  async kill9() {
    return this.proc.kill9();
  }
  log() {
    return this.proc ? this.proc.log() : "";
  }
  /**
   * For graceful runs: every line of the bridge's output (all its runs) is in the NATS log style
   * ("[pid] date time [INF|WRN|ERR|DBG] text") and none is an error.
   */
  assertLogClean() {
    const lines = this.log().split("\n").filter((l) => l && !l.startsWith("---- ") && !l.startsWith("=="));
    const style = /^\[\d+\] \d{4}\/\d{2}\/\d{2} \d{2}:\d{2}:\d{2}\.\d{6} \[(INF|WRN|ERR|DBG)\] /;
    const odd = lines.filter((l) => !style.test(l));
    if (odd.length) throw new Error(`bridge ${this.name}: ${odd.length} log line(s) not in the NATS style, e.g. ${odd[0]}`);
    const errs = lines.filter((l) => l.includes("[ERR]"));
    if (errs.length) throw new Error(`bridge ${this.name}: ${errs.length} [ERR] line(s) in a graceful run, e.g. ${errs[0]}`);
  }
}

/** Run fluxonctl with args (the caller places --server); returns {code, stdout, stderr}. */
export function fluxonctl(args, timeout = 15_000) {
  return runCmd(CTL_BIN, args, { timeout });
}

/** Run fluxon-bridge with args to completion (for --check, --version, bad configs). */
export function bridgeRun(args, timeout = 15_000) {
  return runCmd(BRIDGE_BIN, args, { timeout });
}

/** A process's VmRSS in bytes (/proc/<pid>/status); throws when it has none. */
export function vmRssBytes(pid) {
  const m = /^VmRSS:\s+(\d+) kB$/m.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"));
  if (!m) throw new Error(`no VmRSS for pid ${pid}`);
  return Number(m[1]) * 1024;
}

// ---------------------------------------------------------------------------------------------
// Prometheus text

/** Parse Prometheus text into [{name, labels, value}] (comments skipped). */
export function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    const l = line.trim();
    if (!l || l.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)/.exec(l);
    if (!m) continue;
    const labels = {};
    if (m[3]) {
      const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
      let lm;
      while ((lm = re.exec(m[3]))) labels[lm[1]] = lm[2];
    }
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

/** Sum of series `name` whose labels include `labels`; undefined if there is no such series. */
export function metricValue(series, name, labels = {}) {
  let found = false;
  let sum = 0;
  for (const s of series) {
    if (s.name !== name) continue;
    if (!Object.entries(labels).every(([k, v]) => s.labels[k] === v)) continue;
    found = true;
    sum += s.value;
  }
  return found ? sum : undefined;
}

/** A whole test stack: etcd + nats-server (+ bridges added by the caller). */
export async function startStack(ctx, { natsOpts } = {}) {
  requireBinaries();
  const etcd = new Etcd(ctx);
  const nats = new NatsServer(ctx, "nats", natsOpts);
  await Promise.all([etcd.start(), nats.start()]);
  const prefix = `/fxe2e-${ctx.name}`;
  return {
    etcd,
    nats,
    prefix,
    bridge(opts = {}) {
      return new Bridge(ctx, { nats, etcd, prefix, ...opts });
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Fluxon MQ keys in etcd (bridge/keys.h), read directly to check claims and memberships

/** The MPMC id of channel `name` (R/mq_unique_keys/<name>), or null. */
export async function mpmcId(etcd, prefix, name) {
  const kvs = await etcd.range(`${prefix}/mq_unique_keys/${name}`);
  const kv = kvs.find((k) => k.key === `${prefix}/mq_unique_keys/${name}`);
  return kv ? kv.value.trim() : null;
}

/** Ready keys (claims) of channel `name`: [{key, value (claiming member), lease}]. */
export async function readyKeys(etcd, prefix, name) {
  const id = await mpmcId(etcd, prefix, name);
  if (id === null) return [];
  return etcd.range(`${prefix}/mpmc_channels/ready/${id}/`);
}

/** Membership-like keys (role keys, sub-MPSC memberships, ready keys) under the root. */
export async function membershipKeys(etcd, prefix) {
  const all = await etcd.range(`${prefix}/`);
  const re = new RegExp(`^${prefix.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}/(mpmc_channels/(producer|consumer|ready)/|channels/\\d+/(producer|consumer)/)`);
  return all.filter((kv) => re.test(kv.key));
}

/** Every key under the root R (control plane and, with the etcd KV backend, payloads R/kv/). */
export async function allKeys(etcd, prefix) {
  return etcd.range(`${prefix}/`);
}

/** The sub-MPSC ids of MPMC `id` (R/mpmc_channels/{id}/mpsc_channels, a JSON list). */
export async function subMpscIds(etcd, prefix, id) {
  const kvs = await etcd.range(`${prefix}/mpmc_channels/${id}/mpsc_channels`);
  const kv = kvs.find((k) => k.key === `${prefix}/mpmc_channels/${id}/mpsc_channels`);
  if (!kv) return [];
  return JSON.parse(kv.value).map(String);
}

/**
 * Does `key` belong to MPMC `id` with sub-MPSCs `subs` (bridge/keys.h)? The MPMC's own keys, its
 * role and ready keys, its member-id counter, every key of its sub-MPSCs (meta, memberships,
 * weights, offsets, id counters, cluster-lease keys) and its payload keys under the KV prefix
 * (kvPrefix, default R/kv/). The name mapping R/mq_unique_keys/{name} is not counted here.
 */
export function belongsToMpmc(key, prefix, id, subs, kvPrefix = `${prefix}/kv/`) {
  const own = [
    `${prefix}/mpmc_channels/${id}/`,
    `${prefix}/mpmc_channels/producer/${id}/`,
    `${prefix}/mpmc_channels/consumer/${id}/`,
    `${prefix}/mpmc_channels/ready/${id}/`,
    `${kvPrefix}mpmc/${id}/`,
  ];
  if (own.some((p) => key.startsWith(p))) return true;
  if (key === `${prefix}/dist_id_allocator/mpmc_channels/${id}`) return true;
  for (const c of subs) {
    if (key === `${prefix}/channels/meta/${c}` || key.startsWith(`${prefix}/channels/${c}/`)) return true;
    if (key === `${prefix}/dist_id_allocator/channels/${c}` || key.startsWith(`${prefix}/dist_id_allocator/channels/${c}/`)) return true;
    if (key === `${prefix}/cluster_lease/channels/${c}` || key === `${prefix}/cluster_lease/id_allocator/channels/${c}`) return true;
    if (key.startsWith(`${kvPrefix}mpscchan_${c}_`)) return true;
  }
  return false;
}

/**
 * The lease ids named in the MPMC meta JSON of `id` (R/mpmc_channels/{id}/meta), as decimal
 * strings read from the raw text (lease ids exceed 2^53): {metadata_lease_id, payload_lease_id,
 * id_allocator_cluster_lease_id, raw}; null when the meta is absent.
 */
export async function mpmcMetaLeases(etcd, prefix, id) {
  const kvs = await etcd.range(`${prefix}/mpmc_channels/${id}/meta`);
  const kv = kvs.find((k) => k.key === `${prefix}/mpmc_channels/${id}/meta`);
  if (!kv) return null;
  const out = { raw: kv.value, keyLease: kv.lease };
  for (const f of ["metadata_lease_id", "payload_lease_id", "id_allocator_cluster_lease_id"]) {
    const m = new RegExp(`"${f}"\\s*:\\s*"?(\\d+)`).exec(kv.value);
    out[f] = m ? m[1] : null;
  }
  return out;
}

/** Role keys (R/mpmc_channels/{producer|consumer}/{id}/{member}) and ready keys of MPMC `id`. */
export async function memberKeysOf(etcd, prefix, id) {
  const [p, c, r] = await Promise.all([
    etcd.range(`${prefix}/mpmc_channels/producer/${id}/`),
    etcd.range(`${prefix}/mpmc_channels/consumer/${id}/`),
    etcd.range(`${prefix}/mpmc_channels/ready/${id}/`),
  ]);
  return [...p, ...c, ...r];
}

// ---------------------------------------------------------------------------------------------
// The nats CLI (natscli 0.0.35), built once into <TOOLS>/natscli/nats from the shared tools beside
// the repository clone (<repo>/../shared/tools/natscli/build.sh; FXE2E_NATSCLI_BUILD overrides the
// script). The build (about 40-90 s) is skipped when the binary is there. It builds into a directory
// of its own and is renamed into place, so two suites that build it at once never run a half-written
// binary.
let natsCliBuild = null;
export function natsCli() {
  natsCliBuild ??= (async () => {
    const out = path.join(TOOLS, "natscli");
    const bin = path.join(out, "nats");
    if (fs.existsSync(bin)) return bin;
    const script = process.env.FXE2E_NATSCLI_BUILD || path.resolve(REPO, "..", "shared", "tools", "natscli", "build.sh");
    if (!fs.existsSync(script)) throw new Error(`nats CLI: ${script} is missing (the shared tools must sit beside the repository clone, or set FXE2E_NATSCLI_BUILD)`);
    fs.mkdirSync(out, { recursive: true });
    const tmp = fs.mkdtempSync(path.join(out, "build-"));
    try {
      const r = await runCmd("bash", [script, tmp], { timeout: 600_000 });
      if (r.code !== 0 || !fs.existsSync(path.join(tmp, "nats"))) throw new Error(`nats CLI build failed (${r.code}):\n${r.stderr.slice(-2000)}`);
      fs.renameSync(path.join(tmp, "nats"), bin);
    } finally {
      fs.rmSync(tmp, { recursive: true, force: true });
    }
    return bin;
  })();
  return natsCliBuild;
}
