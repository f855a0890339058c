// Tests of live.mjs, the live-session runner, in both transports (stdio and
// the durable outbox). Every wait is bounded; nothing sleeps for a fixed time.

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { FLAT_TOOLS, NUDGE_TAIL, TOOLS, completion, encodeFrame, toolCall } from "./frames.test.mjs";

const LIVE = fileURLToPath(new URL("../live.mjs", import.meta.url));
const RUNNER_DIR = fileURLToPath(new URL("..", import.meta.url));
const WAIT_MS = 4000;

function framePath(dir, seq) {
  return join(dir, "frames", String(seq).padStart(20, "0") + ".json");
}

function tempDir(t) {
  const dir = mkdtempSync(join(tmpdir(), "wmo-live-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

// Bounded polling for state that only shows up on disk (no stdout to wake us).
async function until(pred, what, timeout = WAIT_MS) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = pred();
    if (value) return value;
    if (Date.now() > deadline) throw new Error("timed out waiting for " + what);
    await new Promise((r) => setTimeout(r, 5));
  }
}

// The envelopes committed in <dir>/frames, in order.
function readOutbox(dir) {
  const names = readdirSync(join(dir, "frames")).filter((n) => /^\d{20}\.json$/.test(n)).sort();
  return names.map((n) => JSON.parse(readFileSync(join(dir, "frames", n), "utf8")));
}

class Live {
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

async function start(t, opts) {
  const r = new Live(opts);
  t.after(() => r.close());
  await r.next("hello");
  return r;
}

function sessionStart(overrides = {}) {
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
async function ready(t, overrides, opts) {
  const r = await start(t, opts);
  r.send(sessionStart(overrides));
  const idle = await r.next("state");
  assert.deepEqual(strip(idle), { type: "state", status: "idle", turns: 0 });
  return r;
}

function strip(frame) {
  const { seq, ...rest } = frame;
  return rest;
}

function llmReply(r, req, comp) {
  r.send({ type: "llm_response", req_id: req.req_id, completion: comp });
}

function toolReply(r, req, content, isError = false) {
  r.send({ type: "tool_response", req_id: req.req_id, content, is_error: isError });
}

async function userTurn(r, msgId, text) {
  r.send({ type: "user_message", msg_id: msgId, text });
  const running = await r.next("state");
  assert.deepEqual(strip(running), { type: "state", status: "running", turns: 0, msg_id: msgId });
  return r.next("llm_request");
}

// Answers an llm_request with a submit call, answers the submit tool_request,
// and returns the terminal idle.
async function submitTurn(r, req, answer) {
  llmReply(r, req, completion({ toolCalls: [toolCall("sub", "submit", { answer })] }));
  const sub = await r.next("tool_request");
  assert.equal(sub.name, "submit");
  assert.deepEqual(sub.arguments, { answer });
  toolReply(r, sub, "submitted");
  return r.next("state");
}

// A ping round trip proves nothing else was emitted before it.
async function quiet(r, nonce) {
  r.send({ type: "ping", nonce });
  const pong = await r.next("pong");
  assert.equal(pong.nonce, nonce);
}

// ---------------------------------------------------------------------------
// stdio transport

test("hello (stdio) carries exactly the documented fields", async (t) => {
  const r = await start(t);
  assert.deepEqual(r.all[0], {
    type: "hello",
    protocol: 1,
    runner_version: "0.1.0",
    node_version: process.version,
    mode: "session",
    transport: "stdio",
  });
});

test("ping/pong before and after session_start; unknown frames ignored", async (t) => {
  const r = await start(t);
  await quiet(r, "n-1");
  r.send({ type: "some_future_frame", x: 1 });
  r.send({ type: "ping", nonce: { any: ["json", 1] } });
  assert.deepEqual((await r.next("pong")).nonce, { any: ["json", 1] });
  r.send(sessionStart());
  assert.deepEqual(await r.next("state"), { type: "state", status: "idle", turns: 0 });
  await quiet(r, 42);
});

test("a turn: bash tool_request, tool_response, submit tool_request, terminal idle", async (t) => {
  const r = await ready(t);
  const req1 = await userTurn(r, "m1", "list the files");
  assert.deepEqual(req1, {
    type: "llm_request",
    req_id: 1,
    openai_body: {
      messages: [
        { role: "system", content: "you are a live test agent" },
        { role: "user", content: "list the files" },
      ],
      tools: TOOLS,
      max_tokens: 256,
      temperature: 0.3,
    },
  });
  llmReply(r, req1, completion({ content: "Looking.", toolCalls: [toolCall("c1", "bash", { cmd: "ls" })] }));
  const treq = await r.next("tool_request");
  assert.deepEqual(treq, { type: "tool_request", req_id: 2, name: "bash", arguments: { cmd: "ls" } });
  toolReply(r, treq, "a.txt\nb.txt");
  const req2 = await r.next("llm_request");
  assert.equal(req2.req_id, 3);
  assert.deepEqual(req2.openai_body.messages.slice(2), [
    { role: "assistant", content: "Looking.", tool_calls: [toolCall("c1", "bash", { cmd: "ls" })] },
    { role: "tool", tool_call_id: "c1", content: "a.txt\nb.txt" },
  ]);
  const idle = await submitTurn(r, req2, "two files");
  assert.deepEqual(idle, { type: "state", status: "idle", turns: 2, reason: "completed", msg_id: "m1" });
  await quiet(r, "after");
});

test("scope \"turn\" clears history between turns; scope \"session\" keeps it", async (t) => {
  for (const scope of ["turn", "session"]) {
    const r = await ready(t, { conversation_scope: scope });
    const req = await userTurn(r, "a", "first");
    await submitTurn(r, req, "one");
    const second = await userTurn(r, "b", "second");
    const msgs = second.openai_body.messages;
    if (scope === "turn") {
      assert.deepEqual(msgs, [
        { role: "system", content: "you are a live test agent" },
        { role: "user", content: "second" },
      ]);
    } else {
      assert.deepEqual(msgs.map((m) => m.role), ["system", "user", "assistant", "tool", "user"]);
      assert.deepEqual(msgs[3], { role: "tool", tool_call_id: "sub", content: "submitted" });
      assert.equal(msgs[4].content, "second");
    }
    const idle = await submitTurn(r, second, "two");
    assert.equal(idle.reason, "completed");
    assert.equal(idle.msg_id, "b");
    await r.close();
  }
});

test("turn_cap model calls end the turn with turn_limit", async (t) => {
  const r = await ready(t, { turn_cap: 2 });
  let req = await userTurn(r, "cap", "loop forever");
  for (let i = 0; i < 2; i++) {
    llmReply(r, req, completion({ toolCalls: [toolCall("c" + i, "bash", { cmd: "true" })] }));
    toolReply(r, await r.next("tool_request"), "");
    if (i === 0) req = await r.next("llm_request");
  }
  assert.deepEqual(await r.next("state"), { type: "state", status: "idle", turns: 2, reason: "turn_limit", msg_id: "cap" });
  await quiet(r, "q");
});

test("text-only replies get nudges, then no_tool_call after three", async (t) => {
  const r = await ready(t);
  let req = await userTurn(r, "talk", "chat");
  llmReply(r, req, completion({ content: "thinking out loud" }));
  req = await r.next("llm_request");
  let last = req.openai_body.messages.at(-1);
  assert.equal(last.role, "user");
  assert.equal(last.content, "[ERROR] Your reply contained no tool call. " + NUDGE_TAIL);
  assert.deepEqual(req.openai_body.messages.at(-2), { role: "assistant", content: "thinking out loud" });
  llmReply(r, req, completion({ content: "cut", toolCalls: [toolCall("x", "bash", { cmd: "ls" })], finish: "length" }));
  req = await r.next("llm_request");
  last = req.openai_body.messages.at(-1);
  assert.match(last.content, /exceeded 256 output tokens/);
  llmReply(r, req, completion({ content: "still talking" }));
  assert.deepEqual(await r.next("state"), { type: "state", status: "idle", turns: 3, reason: "no_tool_call", msg_id: "talk" });
  await quiet(r, "q");
});

test("a steer pending when the nudge budget runs out keeps the turn going", async (t) => {
  const r = await ready(t);
  let req = await userTurn(r, "m1", "chat");
  for (let i = 0; i < 2; i++) {
    llmReply(r, req, completion({ content: "prose " + i }));
    req = await r.next("llm_request");
  }
  r.send({ type: "user_message", msg_id: "m2", text: "what did you find?" });
  await quiet(r, "queued");
  llmReply(r, req, completion({ content: "prose 2" })); // the third text-only reply
  req = await r.next("llm_request");
  assert.deepEqual(req.openai_body.messages.slice(-2), [
    { role: "assistant", content: "prose 2" },
    { role: "user", content: "what did you find?" },
  ]);
  const idle = await submitTurn(r, req, "this");
  assert.deepEqual(idle, { type: "state", status: "idle", turns: 4, reason: "completed", msg_id: "m2" });
});

test("abort while a tool runs: aborted at once, no further requests, late replies ignored", async (t) => {
  const r = await ready(t);
  const req = await userTurn(r, "long", "run something long");
  llmReply(r, req, completion({ toolCalls: [toolCall("t1", "bash", { cmd: "sleep 100" }), toolCall("t2", "bash", { cmd: "ls" })] }));
  const treq = await r.next("tool_request");
  r.send({ type: "abort", reason: "user_interrupt" });
  assert.deepEqual(await r.next("state"), { type: "state", status: "idle", turns: 1, reason: "aborted", msg_id: "long" });
  toolReply(r, treq, "late output"); // no longer pending: ignored
  r.send({ type: "abort", reason: "again" }); // idle: ignored
  await quiet(r, "nothing-else");
  // the session lives on; the cancelled calls are answered in the transcript
  const next = await userTurn(r, "after", "next");
  assert.deepEqual(next.openai_body.messages.slice(2), [
    { role: "assistant", content: null, tool_calls: [toolCall("t1", "bash", { cmd: "sleep 100" }), toolCall("t2", "bash", { cmd: "ls" })] },
    { role: "tool", tool_call_id: "t1", content: "cancelled by user" },
    { role: "tool", tool_call_id: "t2", content: "cancelled by user" },
    { role: "user", content: "next" },
  ]);
});

test("abort while the model call is pending, and a host-interrupted llm reply", async (t) => {
  const r = await ready(t);
  const req = await userTurn(r, "m", "x");
  r.send({ type: "abort", reason: "user_interrupt" });
  assert.deepEqual(await r.next("state"), { type: "state", status: "idle", turns: 0, reason: "aborted", msg_id: "m" });
  llmReply(r, req, completion({ toolCalls: [toolCall("c", "bash", { cmd: "ls" })] }));
  await quiet(r, 1);
  // the host answers "interrupted" itself before its abort frame arrives
  const req2 = await userTurn(r, "m2", "y");
  r.send({ type: "llm_response", req_id: req2.req_id, error: "interrupted" });
  assert.deepEqual(await r.next("state"), { type: "state", status: "idle", turns: 0, reason: "aborted", msg_id: "m2" });
  r.send({ type: "abort", reason: "user_interrupt" });
  await quiet(r, 2);
});

test("a steer while running joins the next llm_request; idle names the last msg_id", async (t) => {
  const r = await ready(t);
  const req = await userTurn(r, "m1", "start");
  r.send({ type: "user_message", msg_id: "m2", text: "also check b.txt" });
  await quiet(r, "steer queued"); // no state frame for a steer
  llmReply(r, req, completion({ toolCalls: [toolCall("c1", "read_file", { path: "a.txt" })] }));
  const treq = await r.next("tool_request");
  toolReply(r, treq, "A");
  const req2 = await r.next("llm_request");
  assert.deepEqual(req2.openai_body.messages.slice(-3), [
    { role: "assistant", content: null, tool_calls: [toolCall("c1", "read_file", { path: "a.txt" })] },
    { role: "tool", tool_call_id: "c1", content: "A" },
    { role: "user", content: "also check b.txt" },
  ]);
  const idle = await submitTurn(r, req2, "done");
  assert.deepEqual(idle, { type: "state", status: "idle", turns: 2, reason: "completed", msg_id: "m2" });
});

test("a steer left unconsumed when the turn ends is reported in cleared_steers", async (t) => {
  const r = await ready(t);
  const req = await userTurn(r, "m1", "start");
  llmReply(r, req, completion({ toolCalls: [toolCall("s", "submit", { answer: "ok" })] }));
  const sub = await r.next("tool_request");
  r.send({ type: "user_message", msg_id: "m2", text: "too late" });
  toolReply(r, sub, "submitted");
  assert.deepEqual(await r.next("state"), {
    type: "state", status: "idle", turns: 1, reason: "completed", msg_id: "m2", cleared_steers: ["m2"],
  });
});

test("a failed model call: episode_error, then idle with reason error", async (t) => {
  const r = await ready(t);
  const req = await userTurn(r, "m", "x");
  r.send({ type: "llm_response", req_id: req.req_id, error: "HTTP 500: upstream" });
  assert.deepEqual(await r.next("episode_error"), { type: "episode_error", note: "model call failed: HTTP 500: upstream" });
  assert.deepEqual(await r.next("state"), { type: "state", status: "idle", turns: 1, reason: "error", msg_id: "m" });
  // a completion without choices[0].message is a failed call too
  const req2 = await userTurn(r, "m2", "y");
  llmReply(r, req2, { choices: [] });
  assert.match((await r.next("episode_error")).note, /^model call failed: llm_response \d+ carried no completion\.choices\[0\]\.message$/);
  assert.equal((await r.next("state")).reason, "error");
  await quiet(r, "q");
});

test("strict correlation: a reply needs the right req_id and the right kind", async (t) => {
  const r = await ready(t);
  const req = await userTurn(r, "m", "x");
  toolReply(r, req, "wrong kind"); // right id, wrong kind
  r.send({ type: "llm_response", req_id: req.req_id + 100, completion: completion({ content: "wrong id" }) });
  r.send({ type: "llm_response", req_id: String(req.req_id), completion: completion({ content: "string id" }) });
  await quiet(r, "still waiting");
  llmReply(r, req, completion({ toolCalls: [toolCall("c", "bash", { cmd: "ls" })] }));
  const treq = await r.next("tool_request");
  llmReply(r, treq, completion({ content: "wrong kind again" }));
  await quiet(r, "still waiting 2");
  toolReply(r, treq, "ok");
  await r.next("llm_request");
});

test("protocol misuse is reported as episode_error", async (t) => {
  const r = await start(t);
  r.send({ type: "user_message", msg_id: "early", text: "hi" });
  assert.match((await r.next("episode_error")).note, /before session_start/);
  r.send(sessionStart());
  await r.next("state");
  r.send(sessionStart());
  assert.match((await r.next("episode_error")).note, /already started/);
  r.send({ type: "user_message", msg_id: 7, text: "hi" });
  assert.match((await r.next("episode_error")).note, /string msg_id/);
});

test("flat tool specs (the reference's shape) reach the model in OpenAI's shape", async (t) => {
  const r = await ready(t, { tools: FLAT_TOOLS });
  const req = await userTurn(r, "m1", "go");
  assert.deepEqual(req.openai_body.tools, TOOLS);
  const idle = await submitTurn(r, req, "ok");
  assert.equal(idle.reason, "completed");
});

test("a session_start with a tool spec of unknown shape is refused: episode_error, no session", async (t) => {
  const r = await start(t);
  r.send(sessionStart({ tools: [TOOLS[0], { type: "function", function: { description: "nameless" } }] }));
  const err = await r.next("episode_error");
  assert.match(err.note, /^session_start: tool spec 1 has an unknown shape \(it has no name\)/);
  r.send({ type: "user_message", msg_id: "m1", text: "hi" });
  assert.match((await r.next("episode_error")).note, /before session_start/);
  // a good session_start still works afterwards
  r.send(sessionStart());
  assert.deepEqual(strip(await r.next("state")), { type: "state", status: "idle", turns: 0 });
});

test("keepalives run for the whole process life, idle included", async (t) => {
  const r = new Live({ env: { WMO_KEEPALIVE_MS: "20" } });
  t.after(() => r.close());
  await r.next("hello");
  const ka = await r.waitFor((f) => f.type === "transport_keepalive", "a keepalive");
  assert.deepEqual(ka, { type: "transport_keepalive" });
});

test("shutdown and stdin EOF exit 0", async (t) => {
  const a = await start(t);
  a.send({ type: "shutdown" });
  assert.equal(await a.exitCode(), 0);
  const b = await ready(t);
  await userTurn(b, "m", "x"); // exits even with a turn in flight
  b.child.stdin.end();
  assert.equal(await b.exitCode(), 0);
});

test("stdio: a frame split across writes, and several frames in one write", async (t) => {
  const r = await start(t);
  const line = encodeFrame(sessionStart());
  const third = Math.floor(line.length / 3);
  await new Promise((res) => r.child.stdin.write(line.slice(0, third), res));
  await new Promise((res) => r.child.stdin.write(line.slice(third, -1), res));
  r.child.stdin.write("\n" + encodeFrame({ type: "ping", nonce: 1 }) + "\n  \r\n" + encodeFrame({ type: "ping", nonce: 2 }));
  assert.equal((await r.next("state")).status, "idle");
  assert.equal((await r.next("pong")).nonce, 1);
  assert.equal((await r.next("pong")).nonce, 2);
});

test("stdio: when the host closes stdout the runner exits 0", async (t) => {
  const r = await start(t);
  r.child.stdout.destroy();
  r.send({ type: "ping", nonce: "into the void" });
  assert.equal(await r.exitCode(), 0);
});

// ---------------------------------------------------------------------------
// Durable outbox

test("durable hello is seq 1, committed to frames/ and head before stdout", async (t) => {
  const dir = tempDir(t);
  const r = await start(t, { outbox: dir });
  assert.deepEqual(r.all[0], {
    type: "hello", protocol: 1, runner_version: "0.1.0", node_version: process.version,
    mode: "session", transport: "durable", seq: 1,
  });
  assert.equal(readFileSync(join(dir, "head"), "utf8"), "1\n");
  assert.equal(readFileSync(framePath(dir, 1), "utf8"), r.lines[0] + "\n");
});

test("durable: pong then ack, duplicate only acked, gap and malformed nacked, no temp files", async (t) => {
  const dir = tempDir(t);
  const r = await start(t, { outbox: dir });
  r.send({ type: "ping", nonce: "a" }); // in seq 1
  assert.deepEqual(await r.next("pong"), { type: "pong", nonce: "a", seq: 2 });
  assert.deepEqual(await r.next("transport_ack"), { type: "transport_ack", transport_in_seq: 1, seq: 3 });
  r.send({ type: "ping", nonce: "a" }, 1); // a resend of in seq 1
  assert.deepEqual(await r.next("transport_ack"), { type: "transport_ack", transport_in_seq: 1, seq: 4 });
  r.send({ type: "ping", nonce: "gap" }, 5);
  assert.deepEqual(await r.next("transport_nack"), { type: "transport_nack", transport_in_seq: 5, expected_transport_in_seq: 2, seq: 5 });
  r.sendRaw({ transport_in_seq: "2", frame: { type: "ping" } });
  assert.deepEqual(strip(await r.next("transport_nack")), { type: "transport_nack", transport_in_seq: "2", expected_transport_in_seq: 2 });
  r.sendRaw({ transport_in_seq: 2, frame: [1] });
  assert.deepEqual(strip(await r.next("transport_nack")), { type: "transport_nack", transport_in_seq: 2, expected_transport_in_seq: 2 });
  r.sendRaw({ type: "ping", nonce: "unenveloped" });
  assert.deepEqual(strip(await r.next("transport_nack")), { type: "transport_nack", transport_in_seq: null, expected_transport_in_seq: 2 });
  // a turn: state:running comes before the ack of its user_message
  r.send(sessionStart()); // in seq 2
  assert.equal((await r.next("state")).status, "idle");
  assert.equal((await r.next("transport_ack")).transport_in_seq, 2);
  r.send({ type: "user_message", msg_id: "m", text: "go" }); // in seq 3
  assert.equal((await r.next("state")).status, "running");
  assert.equal((await r.next("transport_ack")).transport_in_seq, 3);
  const req = await r.next("llm_request");
  llmReply(r, req, completion({ toolCalls: [toolCall("s", "submit", { answer: "42" })] }));
  assert.equal((await r.next("transport_ack")).transport_in_seq, 4);
  const sub = await r.next("tool_request");
  toolReply(r, sub, "submitted");
  assert.equal((await r.next("transport_ack")).transport_in_seq, 5);
  const idle = await r.next("state");
  assert.deepEqual(strip(idle), { type: "state", status: "idle", turns: 1, reason: "completed", msg_id: "m" });
  // shutdown: acked first, then the process exits
  r.send({ type: "shutdown" }); // in seq 6
  assert.equal((await r.next("transport_ack")).transport_in_seq, 6);
  assert.equal(await r.exitCode(), 0);
  // the disk holds exactly what came on stdout, and nothing else
  const disk = readOutbox(dir);
  assert.deepEqual(disk.map((e) => JSON.stringify(e)), r.lines);
  assert.equal(readFileSync(join(dir, "head"), "utf8"), `${r.lines.length}\n`);
  assert.deepEqual(readdirSync(join(dir, "frames")).filter((n) => n.startsWith(".")), []);
  assert.deepEqual(readdirSync(dir).filter((n) => n.startsWith(".")), []);
});

test("durable: keepalives are raw on stdout and never persisted", async (t) => {
  const dir = tempDir(t);
  const r = await start(t, { outbox: dir, env: { WMO_KEEPALIVE_MS: "20" } });
  const ka = await r.waitFor((f) => f.type === "transport_keepalive", "a keepalive");
  assert.deepEqual(ka, { type: "transport_keepalive" }); // no seq: not an envelope
  await quiet(r, "x");
  await r.next("transport_ack");
  assert.deepEqual(readOutbox(dir).map((e) => e.frame.type), ["hello", "pong", "transport_ack"]);
});

test("durable: numbering continues from an existing head; a bad head refuses to start", async (t) => {
  const dir = tempDir(t);
  writeFileSync(join(dir, "head"), "41\n");
  const r = await start(t, { outbox: dir });
  assert.equal(r.all[0].seq, 42);
  assert.ok(existsSync(framePath(dir, 42)));
  await r.close();

  const bad = tempDir(t);
  writeFileSync(join(bad, "head"), "-3\n");
  const b = new Live({ outbox: bad });
  t.after(() => b.close());
  assert.equal(await b.exitCode(), 3);
  await b.closed;
  assert.match(b.stderr, /head holds "-3\\n", not an integer >= 0/);
  assert.equal(b.all.length, 0);
  assert.match(readFileSync(join(bad, "stderr.log"), "utf8"), /not an integer >= 0/);
});

test("durable: the host loses stdout mid-turn; frames keep landing on disk and the turn completes", async (t) => {
  const dir = tempDir(t);
  const r = await start(t, { outbox: dir });
  r.skipAcks = true;
  r.send(sessionStart()); // in 1
  await r.next("state");
  r.send({ type: "user_message", msg_id: "m", text: "work" }); // in 2
  await r.next("state");
  const req = await r.next("llm_request");
  const seenOnStdout = r.all.length;
  r.child.stdout.destroy(); // the host's view of stdout is gone; the runner lives on

  const onDisk = (pred, what) => until(() => readOutbox(dir).find((e) => pred(e.frame)), what);
  llmReply(r, req, completion({ toolCalls: [toolCall("c1", "bash", { cmd: "make" })] })); // in 3
  const treq = (await onDisk((f) => f.type === "tool_request", "the tool_request on disk")).frame;
  assert.deepEqual(treq.arguments, { cmd: "make" });
  toolReply(r, treq, "built"); // in 4
  const req2 = (await onDisk((f) => f.type === "llm_request" && f.req_id !== req.req_id, "the second llm_request")).frame;
  assert.equal(req2.openai_body.messages.at(-1).content, "built");
  llmReply(r, req2, completion({ toolCalls: [toolCall("s", "submit", { answer: "made" })] })); // in 5
  const sub = (await onDisk((f) => f.type === "tool_request" && f.name === "submit", "the submit")).frame;
  toolReply(r, sub, "submitted"); // in 6
  const idle = await onDisk((f) => f.type === "state" && f.status === "idle" && f.reason, "the terminal idle");
  assert.deepEqual(idle.frame, { type: "state", status: "idle", turns: 2, reason: "completed", msg_id: "m" });
  r.send({ type: "ping", nonce: "alive" }); // in 7
  await onDisk((f) => f.type === "pong" && f.nonce === "alive", "the pong");
  await until(() => readOutbox(dir).some((e) => e.frame.type === "transport_ack" && e.frame.transport_in_seq === 7), "ack 7");

  // the disk is gap-free and agrees with what stdout carried before the loss
  const disk = readOutbox(dir);
  disk.forEach((e, i) => assert.equal(e.transport_seq, i + 1));
  assert.deepEqual(disk.slice(0, r.lines.length).map((e) => JSON.stringify(e)), r.lines);
  assert.ok(disk.length > seenOnStdout);
  assert.equal(readFileSync(join(dir, "head"), "utf8"), `${disk.length}\n`);
  assert.match(readFileSync(join(dir, "stderr.log"), "utf8"), /stdout failed .*frames continue in the durable outbox/);
  assert.equal(r.exitInfo, undefined, "the runner is still alive");
  r.send({ type: "shutdown" }); // in 8
  assert.equal(await r.exitCode(), 0);
});
