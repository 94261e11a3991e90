// client.mjs -- the test's side of NATS, with the npm `nats` package (a client this project did
// not write): connections, self-describing messages, acked publishes with bounded concurrency,
// and consumers that record every delivery.

import { createRequire } from "node:module";
import { setTimeout as delay } from "node:timers/promises";
import { connect, headers as natsHeaders, StringCodec, Empty } from "nats";
import { waitFor } from "./stack.mjs";

const require = createRequire(import.meta.url);
// The npm client's own JetStream message wrapper and ack-subject parser (nats/lib/jetstream).
const { toJsMsg, parseInfo } = require("nats/lib/jetstream/jsmsg.js");
export { toJsMsg, parseInfo, Empty, natsHeaders };

export const sc = StringCodec();

/** Connect; closed when the test ends. Reconnects forever (for server restarts). */
export async function natsConnect(ctx, url, name = "e2e") {
  const nc = await connect({
    servers: url,
    name: `${ctx.name}-${name}`,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 100,
    pingInterval: 2000,
  });
  ctx.defer(async () => {
    try {
      await Promise.race([nc.close(), delay(3000)]);
    } catch {
      /* closed */
    }
  });
  return nc;
}

// ---------------------------------------------------------------------------------------------
// Messages: JSON head, a newline, then a deterministic binary tail (all 256 byte values occur)

function tail(n) {
  const len = 16 + (n % 48);
  const b = Buffer.alloc(len);
  let x = (n * 2654435761) >>> 0;
  for (let i = 0; i < len; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    b[i] = (x >>> 16) & 0xff;
  }
  return b;
}

/** A message: {id, n, subject, data, headers}. tag makes ids unique across tests. */
export function makeMsg(tag, n, subject, extraHeaders = {}) {
  const id = `${tag}-${n}`;
  const head = Buffer.from(JSON.stringify({ id, n, subject }));
  const data = Buffer.concat([head, Buffer.from([0x0a]), tail(n)]);
  const h = natsHeaders();
  h.set("X-Id", id);
  h.append("X-Multi", `first-${n}`);
  h.append("X-Multi", "second");
  for (const [k, v] of Object.entries(extraHeaders)) h.set(k, v);
  return { id, n, subject, data: new Uint8Array(data), headers: h };
}

/** Decode and verify a message body made by makeMsg; returns {id, n, subject} or throws. */
export function parseBody(data) {
  const buf = Buffer.from(data);
  const nl = buf.indexOf(0x0a);
  if (nl < 0) throw new Error(`body without newline: ${buf.toString("latin1").slice(0, 80)}`);
  const head = JSON.parse(buf.subarray(0, nl).toString());
  const want = tail(head.n);
  if (!buf.subarray(nl + 1).equals(want)) throw new Error(`body tail of ${head.id} corrupted`);
  return head;
}

// ---------------------------------------------------------------------------------------------
// Publishing with acks

/** One publish with a reply: returns {ok:true, ack} or {ok:false, error, code}. */
export async function publishAcked(nc, msg, timeout = 10_000) {
  try {
    const r = await nc.request(msg.subject, msg.data, { timeout, headers: msg.headers });
    let j;
    try {
      j = JSON.parse(sc.decode(r.data));
    } catch {
      return { ok: false, error: `PubAck is not JSON: ${sc.decode(r.data).slice(0, 200)}`, code: "json" };
    }
    if (j.error) return { ok: false, error: j.error.description, code: j.error.code, reply: j };
    return { ok: true, ack: j };
  } catch (e) {
    return { ok: false, error: e.message, code: e.code };
  }
}

/** Run fn over items with at most `concurrency` in flight. */
export async function pool(items, concurrency, fn) {
  let next = 0;
  const workers = [];
  for (let w = 0; w < Math.min(concurrency, items.length); w++) {
    workers.push((async () => {
      for (;;) {
        const i = next++;
        if (i >= items.length) return;
        await fn(items[i], i);
      }
    })());
  }
  await Promise.all(workers);
}

/**
 * Publish every message with a reply and bounded concurrency. With retry, a failed publish
 * (no responders, timeout, disconnect, error reply) is retried until it is acked or `deadline`
 * (ms from now) passes. Returns {acked: Map id->ack, failed: Map id->last error, attempts: Map,
 * errCodes: Map code->count}.
 * onAck(msg, ack, countSoFar) is called for each success.
 */
export async function publishAll(nc, msgs, { concurrency = 256, retry = false, deadline = 120_000, timeout = 10_000, onAck } = {}) {
  const acked = new Map();
  const failed = new Map();
  const attempts = new Map();
  const errCodes = new Map(); // error code (e.g. "503", "TIMEOUT", 413) -> count, over all attempts
  const end = Date.now() + deadline;
  await pool(msgs, concurrency, async (m) => {
    for (;;) {
      attempts.set(m.id, (attempts.get(m.id) || 0) + 1);
      const r = await publishAcked(nc, m, timeout);
      if (r.ok) {
        acked.set(m.id, r.ack);
        failed.delete(m.id);
        if (onAck) onAck(m, r.ack, acked.size);
        return;
      }
      failed.set(m.id, r);
      errCodes.set(String(r.code), (errCodes.get(String(r.code)) || 0) + 1);
      if (!retry || Date.now() > end) return;
      // retry pacing while the bridge or the server is away (not a synchronisation sleep)
      await delay(50);
    }
  });
  return { acked, failed, attempts, errCodes };
}

/**
 * Publish an open-ended stream of acked messages (make(n) builds message n) with `concurrency`
 * in flight, each retried until acked, until stop() is called. stop() lets every in-flight
 * message finish (acked, or given up after `drain` ms of retries) and resolves
 * {acked: Map id->ack, failed: Map id->last error, attempts, errCodes, published}.
 * Live counters: s.acked.size, s.published.
 */
export function publishStream(nc, make, { concurrency = 64, timeout = 5000, drain = 60_000, onAck } = {}) {
  const s = { acked: new Map(), failed: new Map(), attempts: new Map(), errCodes: new Map(), published: 0 };
  let stopping = false;
  let giveUpAt = Infinity;
  let next = 0;
  const worker = async () => {
    while (!stopping) {
      const m = make(next++);
      s.published++;
      for (;;) {
        s.attempts.set(m.id, (s.attempts.get(m.id) || 0) + 1);
        const r = await publishAcked(nc, m, timeout);
        if (r.ok) {
          s.acked.set(m.id, r.ack);
          s.failed.delete(m.id);
          if (onAck) onAck(m, r.ack, s.acked.size);
          break;
        }
        s.failed.set(m.id, r);
        s.errCodes.set(String(r.code), (s.errCodes.get(String(r.code)) || 0) + 1);
        if (Date.now() > giveUpAt) break;
        await delay(50); // retry pacing while a bridge is away (not a synchronisation sleep)
      }
    }
  };
  const workers = Array.from({ length: concurrency }, worker);
  s.stop = async () => {
    stopping = true;
    giveUpAt = Date.now() + drain;
    await Promise.all(workers);
    return s;
  };
  return s;
}

// ---------------------------------------------------------------------------------------------
// Consuming

/**
 * Subscribe to `subject` and record every delivery. ackMode:
 *   "ack"   respond "+ACK";  "empty" respond with an empty body;  "none" do not respond;
 *   a function (m, rec, consumer) -> string|null|undefined: respond with that body (null: nothing).
 * Each record: {id, n, subject (delivery subject), origSubject (from the body), headers, reply,
 * delivered (Fluxon-Delivered), seq (Fluxon-Seq), channel, fluxonSubject}.
 */
export class Consumer {
  constructor(nc, subject, { ackMode = "ack", queue } = {}) {
    this.nc = nc;
    this.subject = subject;
    this.ackMode = ackMode;
    this.records = [];
    this.counts = new Map();
    this.errors = [];
    this.sub = nc.subscribe(subject, {
      queue,
      callback: (err, m) => {
        if (err) {
          this.errors.push(err);
          return;
        }
        try {
          this.onMsg(m);
        } catch (e) {
          this.errors.push(e);
        }
      },
    });
  }
  onMsg(m) {
    const h = m.headers;
    const get = (k) => (h ? h.get(k) : "");
    let body;
    try {
      body = parseBody(m.data);
    } catch (e) {
      this.errors.push(new Error(`delivery on ${m.subject}: ${e.message}`));
      body = { id: null };
    }
    const rec = {
      id: body.id,
      n: body.n,
      origSubject: body.subject,
      subject: m.subject,
      reply: m.reply || "",
      headers: h,
      xid: get("X-Id"),
      multi: h ? h.values("X-Multi") : [],
      channel: get("Fluxon-Channel"),
      fluxonSubject: get("Fluxon-Subject"),
      seq: get("Fluxon-Seq"),
      delivered: Number(get("Fluxon-Delivered")),
      deadReason: get("Fluxon-Dead-Reason"),
      msg: m,
      at: Date.now(), // arrival time (ms), for latency bounds
    };
    this.records.push(rec);
    if (rec.id) this.counts.set(rec.id, (this.counts.get(rec.id) || 0) + 1);
    let body2 = null;
    if (typeof this.ackMode === "function") body2 = this.ackMode(m, rec, this);
    else if (this.ackMode === "ack") body2 = "+ACK";
    else if (this.ackMode === "empty") body2 = "";
    if (body2 !== null && body2 !== undefined && m.reply) {
      m.respond(body2 === "" ? Empty : sc.encode(body2));
    }
  }
  /** Distinct ids received. */
  get unique() {
    return this.counts.size;
  }
  /** [id, count] pairs with count > 1. */
  duplicates() {
    return [...this.counts].filter(([, c]) => c > 1);
  }
  /** Throw (fatal for waitFor) if a delivery could not be decoded or handled. */
  check() {
    if (this.errors.length) {
      const e = new Error(`consumer ${this.subject}: ${this.errors[0].message}`);
      e.fatal = true;
      throw e;
    }
  }
  async waitUnique(n, timeout, what) {
    await waitFor(() => (this.check(), this.unique >= n), { timeout, what: () => what || `${n} distinct messages on ${this.subject} (have ${this.unique})` });
  }
  async unsubscribe() {
    this.sub.unsubscribe();
    await this.nc.flush();
  }
}

/** Request/reply JSON on an admin subject. */
export async function adminRequest(nc, subject, timeout = 5000) {
  const r = await nc.request(subject, Empty, { timeout });
  return JSON.parse(sc.decode(r.data));
}

export async function channelInfo(nc, name) {
  return adminRequest(nc, `$FLUXON.API.CHANNEL.INFO.${name}`);
}

/** Number of sub-MPSCs with ready=true (claimed) in a CHANNEL.INFO answer. */
export function readyCount(info) {
  if (!info || !Array.isArray(info.sub_mpscs)) return 0;
  return info.sub_mpscs.filter((s) => s.ready === true).length;
}

/** Wait until channel `name` has at least n claimed sub-MPSCs (admin API). */
export async function waitClaims(nc, name, n, timeout = 10_000) {
  return waitFor(async () => {
    const info = await channelInfo(nc, name);
    return readyCount(info) >= n ? info : null;
  }, { timeout, what: `${n} claim(s) on channel ${name}` });
}

/** Wait until the backlog reported by the admin API equals n. */
export async function waitBacklog(nc, name, n, timeout = 15_000) {
  let last;
  try {
    return await waitFor(async () => {
      last = await channelInfo(nc, name);
      return last.backlog === n ? last : null;
    }, { timeout, what: `backlog ${n} on ${name}` });
  } catch (e) {
    throw new Error(`${e.message}; last info: ${JSON.stringify(last)}`);
  }
}

/** Wait until the consumers together hold at least n distinct ids. */
export async function waitUniqueAcross(consumers, n, timeout, what) {
  const distinct = () => {
    const s = new Set();
    for (const c of consumers) for (const id of c.counts.keys()) s.add(id);
    return s.size;
  };
  await waitFor(() => (consumers.forEach((c) => c.check()), distinct() >= n), { timeout, interval: 100, what: () => what || `${n} distinct messages across ${consumers.map((c) => c.subject).join("+")} (have ${distinct()})` });
}
