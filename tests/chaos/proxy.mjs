// proxy.mjs -- a TCP proxy for fault injection between a bridge and one etcd member. Modes:
//   pass          bytes flow both ways
//   delay(ms)     every chunk, both ways, is forwarded ms later (order kept per direction)
//   drop          requests reach etcd, its answers are discarded (the client cannot know whether
//                 a txn it sent was applied); when the mode ends, every connection that lost an
//                 answer is reset (its HTTP stream is broken)
//   cut           every connection is reset and new ones are refused (a partition)
// Bounded: each direction of a connection holds at most MAX_QUEUED bytes while delayed; beyond
// that the connection is reset (counted in resets).
import net from "node:net";

const MAX_QUEUED = 8 << 20;

export class FaultProxy {
  constructor(targetPort, name = "proxy") {
    this.targetPort = targetPort;
    this.name = name;
    this.mode = "pass";
    this.delayMs = 0;
    this.conns = new Set();
    this.stats = { conns: 0, dropped: 0, delayed: 0, resets: 0, refused: 0 };
  }

  async start() {
    this.server = net.createServer((client) => this.accept(client));
    this.server.on("error", () => {});
    await new Promise((res) => this.server.listen(0, "127.0.0.1", res));
    return this;
  }

  get port() {
    return this.server.address().port;
  }
  get url() {
    return `http://127.0.0.1:${this.port}`;
  }

  accept(client) {
    if (this.mode === "cut") {
      this.stats.refused++;
      client.on("error", () => {});
      client.destroy();
      return;
    }
    this.stats.conns++;
    const up = net.connect(this.targetPort, "127.0.0.1");
    const c = { client, up, lostAnswer: false, q: { toUp: null, toClient: null } };
    c.q.toUp = new DelayQueue(up, () => this.reset(c));
    c.q.toClient = new DelayQueue(client, () => this.reset(c));
    this.conns.add(c);
    for (const s of [client, up]) {
      s.on("error", () => {});
      s.on("close", () => this.reset(c));
    }
    client.on("data", (d) => this.forward(c, c.q.toUp, d, false));
    up.on("data", (d) => this.forward(c, c.q.toClient, d, true));
    client.on("end", () => c.q.toUp.end());
    up.on("end", () => c.q.toClient.end());
  }

  forward(c, q, chunk, isAnswer) {
    if (isAnswer && this.mode === "drop") {
      c.lostAnswer = true;
      this.stats.dropped += chunk.length;
      return;
    }
    const wait = this.mode === "delay" ? this.delayMs : 0;
    if (wait > 0) this.stats.delayed++;
    q.push(chunk, wait);
  }

  reset(c) {
    if (!this.conns.delete(c)) return;
    c.q.toUp.clear();
    c.q.toClient.clear();
    c.client.destroy();
    c.up.destroy();
  }

  set(mode, delayMs = 0) {
    const was = this.mode;
    this.mode = mode;
    this.delayMs = delayMs;
    if (mode === "cut") {
      for (const c of [...this.conns]) {
        this.stats.resets++;
        this.reset(c);
      }
    }
    if (was === "drop" && mode !== "drop") {
      for (const c of [...this.conns]) {
        if (c.lostAnswer) {
          this.stats.resets++;
          this.reset(c);
        }
      }
    }
  }

  async close() {
    for (const c of [...this.conns]) this.reset(c);
    await new Promise((res) => this.server.close(() => res()));
  }
}

/** Chunks written to dst in order, each not before its release time. */
class DelayQueue {
  constructor(dst, onOverflow) {
    this.dst = dst;
    this.onOverflow = onOverflow;
    this.items = [];
    this.bytes = 0;
    this.timer = null;
    this.ended = false;
    this.lastRelease = 0;
  }
  push(chunk, wait) {
    const now = Date.now();
    if (wait <= 0 && this.items.length === 0) {
      this.dst.write(chunk);
      return;
    }
    const at = Math.max(now + wait, this.lastRelease);
    this.lastRelease = at;
    this.items.push({ at, chunk });
    this.bytes += chunk.length;
    if (this.bytes > MAX_QUEUED) {
      this.onOverflow();
      return;
    }
    this.arm();
  }
  arm() {
    if (this.timer || this.items.length === 0) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      this.flush();
    }, Math.max(0, this.items[0].at - Date.now()));
  }
  flush() {
    const now = Date.now();
    while (this.items.length && this.items[0].at <= now) {
      const it = this.items.shift();
      this.bytes -= it.chunk.length;
      this.dst.write(it.chunk);
    }
    if (this.items.length) this.arm();
    else if (this.ended) this.dst.end();
  }
  end() {
    this.ended = true;
    if (this.items.length === 0) this.dst.end();
  }
  clear() {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.items = [];
    this.bytes = 0;
  }
}
