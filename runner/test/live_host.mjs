// A host for live.mjs in tests: spawns the live-session runner in either
// transport (stdio, or the durable outbox), reads and checks what it writes,
// and answers it. Every wait is bounded; nothing sleeps for a fixed time.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { TOOLS, completion, encodeFrame, toolCall } from "./frames.test.mjs";

export const LIVE = fileURLToPath(new URL("../live.mjs", import.meta.url));
const RUNNER_DIR = fileURLToPath(new URL("..", import.meta.url));
export const WAIT_MS = 4000;

export function framePath(dir, seq) {
  return join(dir, "frames", String(seq).padStart(20, "0") + ".json");
}

export function tempDir(t) {
  const dir = mkdtempSync(join(tmpdir(), "wmo-live-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

// Bounded polling for state that only shows up on disk (no stdout to wake us).
export async function until(pred, what, timeout = WAIT_MS) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = pred();
    if (value) return value;
    if (Date.now() > deadline) throw new Error("timed out waiting for " + what);
    await new Promise((r) => setTimeout(r, 5));
  }
}

// The envelopes committed in <dir>/frames, in order.
export function readOutbox(dir) {
  const names = readdirSync(join(dir, "frames")).filter((n) => /^\d{20}\.json$/.test(n)).sort();
  return names.map((n) => JSON.parse(readFileSync(join(dir, "frames", n), "utf8")));
}

export class Live {
  constructor({ outbox = null, env = {} } = {}) {
    const childEnv = { ...process.env };
    delete childEnv.WMO_LIVE_OUTBOX;
    delete childEnv.WMO_KEEPALIVE_MS;
    if (outbox !== null) childEnv.WMO_LIVE_OUTBOX = outbox;
    Object.assign(childEnv, env);
    this.outbox = outbox;
    this.child = spawn(process.execPath, [LIVE], { cwd: RUNNER_DIR, env: childEnv, stdio: ["pipe", "pipe", "pipe"] });
    this.all = []; // every frame (unwrapped), in order
    this.lines = []; // the JSON text of every durable envelope, in order
    this.queue = [];
    this.waiters = [];
    this.stderr = "";
    this.problems = []; // wire-format or ordering violations seen while reading
    this.inSeq = 0;
    this.skipAcks = false; // durable tests that do not check acks set this
    this.parts = [];
    this.stdoutEnded = false;
    this.child.stdout.setEncoding("latin1");
    this.child.stdout.on("data", (chunk) => this.onStdout(chunk));
    this.child.stdout.on("end", () => {
      this.stdoutEnded = true;
      this.wake();
    });
    this.child.stdout.on("error", () => {});
    this.child.stderr.setEncoding("utf8");
    this.child.stderr.on("data", (c) => (this.stderr += c));
    this.child.stdin.on("error", () => {});
    // 'close' comes after stdout and stderr have ended ('exit' may come before)
    this.closed = new Promise((resolve) => this.child.on("close", resolve));
    this.exited = new Promise((resolve) =>
      this.child.on("exit", (code, signal) => {
        this.exitInfo = { code, signal };
        this.wake();
        resolve({ code, signal });
      })
    );
  }

  onStdout(chunk) {
    let start = 0;
    let nl;
    while ((nl = chunk.indexOf("\n", start)) !== -1) {
      this.parts.push(chunk.slice(start, nl));
      const line = this.parts.join("");
      this.parts = [];
      start = nl + 1;
      this.onLine(line);
    }
    if (start < chunk.length) this.parts.push(chunk.slice(start));
    this.wake();
  }

  onLine(line) {
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(line) || line.length % 4 !== 0 || line === "") {
      this.problems.push("not strict base64: " + JSON.stringify(line.slice(0, 80)));
      return;
    }
    const json = Buffer.from(line, "base64").toString("utf8");
    const value = JSON.parse(json);
    let frame = value;
    if (this.outbox !== null && value.type !== "transport_keepalive") {
      const seq = value.transport_seq;
      if (!Number.isSafeInteger(seq) || typeof value.frame !== "object") {
        this.problems.push("not an envelope: " + json.slice(0, 200));
        return;
      }
      // The frame file and head must be committed before the line is written.
      const file = framePath(this.outbox, seq);
      if (!existsSync(file)) this.problems.push(`seq ${seq} came on stdout before ${file} existed`);
      else if (readFileSync(file, "utf8") !== json + "\n") this.problems.push(`seq ${seq}: file differs from stdout`);
      const head = Number(readFileSync(join(this.outbox, "head"), "utf8"));
      if (!(head >= seq)) this.problems.push(`seq ${seq} came on stdout while head was ${head}`);
      const expected = this.all.filter((f) => f.seq !== undefined).length + (this.firstSeq ?? seq);
      if (this.firstSeq === undefined) this.firstSeq = seq;
      if (seq !== expected) this.problems.push(`seq ${seq} where ${expected} was expected`);
      this.lines.push(json);
      frame = { ...value.frame, seq };
    }
    if (typeof frame.type !== "string") this.problems.push("frame without a type: " + json.slice(0, 200));
    this.all.push(frame);
    this.queue.push(frame);
  }

  wake() {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  // Host -> runner. In durable mode the frame is enveloped with the next
  // inbound seq (or `seq`, to test duplicates and gaps).
  send(frame, seq) {
    if (this.outbox === null) {
      this.child.stdin.write(encodeFrame(frame));
      return;
    }
    const n = seq === undefined ? ++this.inSeq : seq;
    this.child.stdin.write(Buffer.from(JSON.stringify({ transport_in_seq: n, frame })).toString("base64") + "\n");
  }

  sendRaw(value) {
    this.child.stdin.write(Buffer.from(JSON.stringify(value)).toString("base64") + "\n");
  }

  // Consumes frames until one satisfies `pred`. Keepalives (and acks, when
  // `skipAcks` is set and the caller is not waiting for one) are skipped; any
  // other frame on the way is an error.
  async waitFor(pred, what, skipAcks = false) {
    const deadline = Date.now() + WAIT_MS;
    for (;;) {
      if (this.problems.length > 0) throw new Error("wire problems: " + this.problems.join("; "));
      while (this.queue.length > 0) {
        const f = this.queue.shift();
        if (pred(f)) return f;
        if (f.type === "transport_keepalive" || (skipAcks && f.type === "transport_ack")) continue;
        throw new Error(`expected ${what}, got ${JSON.stringify(f)}; stderr:\n${this.stderr}`);
      }
      if (this.stdoutEnded) throw new Error(`stdout ended (${JSON.stringify(this.exitInfo)}) while waiting for ${what}; stderr:\n${this.stderr}`);
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`timed out waiting for ${what}; stderr:\n${this.stderr}`);
      let timer;
      await Promise.race([new Promise((r) => this.waiters.push(r)), new Promise((r) => (timer = setTimeout(r, left)))]);
      clearTimeout(timer);
    }
  }

  // The next non-keepalive frame; it must have `type`.
  next(type) {
    return this.waitFor((f) => f.type === type, `a ${type} frame`, this.skipAcks && type !== "transport_ack");
  }

  async exitCode() {
    let timer;
    const res = await Promise.race([
      this.exited,
      new Promise((_, rej) => (timer = setTimeout(() => rej(new Error("runner did not exit; stderr:\n" + this.stderr)), WAIT_MS))),
    ]);
    clearTimeout(timer);
    return res.code;
  }

  async close() {
    if (!this.exitInfo) {
      this.child.stdin.end();
      try {
        await this.exitCode();
      } catch {
        this.child.kill("SIGKILL");
        await this.exited;
      }
    }
  }
}

export async function start(t, opts) {
  const r = new Live(opts);
  t.after(() => r.close());
  await r.next("hello");
  return r;
}

export function sessionStart(overrides = {}) {
  return {
    type: "session_start",
    session_id: "0123456789abcdef0123456789abcdef",
    system: "you are a live test agent",
    tools: TOOLS,
    files: {},
    turn_cap: 60,
    max_output_tokens: 256,
    temperature: 0.3,
    conversation_scope: "session",
    context_window: null,
    ...overrides,
  };
}

// Starts a runner with a ready session.
export async function ready(t, overrides, opts) {
  const r = await start(t, opts);
  r.send(sessionStart(overrides));
  const idle = await r.next("state");
  assert.deepEqual(strip(idle), { type: "state", status: "idle", turns: 0 });
  return r;
}

export function strip(frame) {
  const { seq, ...rest } = frame;
  return rest;
}

export function llmReply(r, req, comp) {
  r.send({ type: "llm_response", req_id: req.req_id, completion: comp });
}

export function toolReply(r, req, content, isError = false) {
  r.send({ type: "tool_response", req_id: req.req_id, content, is_error: isError });
}

export async function userTurn(r, msgId, text) {
  r.send({ type: "user_message", msg_id: msgId, text });
  const running = await r.next("state");
  assert.deepEqual(strip(running), { type: "state", status: "running", turns: 0, msg_id: msgId });
  return r.next("llm_request");
}

// Answers an llm_request with a submit call, answers the submit tool_request,
// and returns the terminal idle.
export async function submitTurn(r, req, answer) {
  llmReply(r, req, completion({ toolCalls: [toolCall("sub", "submit", { answer })] }));
  const sub = await r.next("tool_request");
  assert.equal(sub.name, "submit");
  assert.deepEqual(sub.arguments, { answer });
  toolReply(r, sub, "submitted");
  return r.next("state");
}

// A ping round trip proves nothing else was emitted before it.
export async function quiet(r, nonce) {
  r.send({ type: "ping", nonce });
  const pong = await r.next("pong");
  assert.equal(pong.nonce, nonce);
}
