// Test helpers for talking to runner.mjs over its framed stdio channel, plus
// tests of the helpers' own codec. The other test files import from here; the
// tests at the bottom only register when this file is the one being run.

import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath, pathToFileURL } from "node:url";
import { test } from "node:test";
import assert from "node:assert/strict";

export const RUNNER = fileURLToPath(new URL("../runner.mjs", import.meta.url));

export const NUDGE_TAIL =
  "Continue the task: either call exactly one tool now, or call `submit` with your final answer " +
  "if the task is already complete. Do not reply with prose alone.";

export const TOOLS = [
  { type: "function", function: { name: "bash", description: "Run a command", parameters: { type: "object", properties: { cmd: { type: "string" } }, required: ["cmd"] } } },
  { type: "function", function: { name: "read_file", description: "Read a file", parameters: { type: "object", properties: { path: { type: "string" } }, required: ["path"] } } },
  { type: "function", function: { name: "write_file", description: "Write a file", parameters: { type: "object", properties: { path: { type: "string" }, content: { type: "string" } }, required: ["path", "content"] } } },
  { type: "function", function: { name: "submit", description: "Submit the final answer", parameters: { type: "object", properties: { answer: { type: "string" } }, required: ["answer"] } } },
];

// TOOLS in the reference runtime's flat shape: {name, description, parameters}.
export const FLAT_TOOLS = TOOLS.map((t) => ({ ...t.function }));

// runner.mjs's hello, without pi.
export const EPISODE_HELLO = {
  type: "hello",
  protocol: 1,
  runner_version: "0.1.0",
  node_version: process.version,
  harness: "builtin",
  transport: "stdio",
  max_concurrent: 1,
};

// The openai_body of a run's first model call: the system prompt, the user's
// text, TOOLS, then `limits` (max_tokens, temperature).
export function firstModelBody(system, user, limits) {
  return {
    messages: [
      { role: "system", content: system },
      { role: "user", content: user },
    ],
    tools: TOOLS,
    ...limits,
  };
}

export function encodeFrame(frame) {
  return encodeJsonText(JSON.stringify(frame));
}

export function encodeJsonText(json) {
  return Buffer.from(json, "utf8").toString("base64") + "\n";
}

// Strict decode, like the host: the line must be clean base64 of a JSON object.
export function decodeLine(line) {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(line) || line.length % 4 !== 0) {
    throw new Error("runner wrote a line that is not strict base64: " + JSON.stringify(line.slice(0, 80)));
  }
  const value = JSON.parse(Buffer.from(line, "base64").toString("utf8"));
  if (value === null || typeof value !== "object" || Array.isArray(value) || typeof value.type !== "string") {
    throw new Error("runner wrote a frame that is not an object with a string type");
  }
  return value;
}

export function toolCall(id, name, args) {
  return { id, type: "function", function: { name, arguments: typeof args === "string" ? args : JSON.stringify(args) } };
}

export function completion({ content = null, toolCalls, finish, extra } = {}) {
  const message = { role: "assistant", content };
  if (toolCalls) message.tool_calls = toolCalls;
  const choice = { index: 0, message, finish_reason: finish || (toolCalls ? "tool_calls" : "stop") };
  if (extra) Object.assign(choice, extra);
  return { id: "chatcmpl-test", object: "chat.completion", model: "test", choices: [choice], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } };
}

export function episodeStart(id, overrides = {}) {
  return {
    type: "episode_start",
    episode_id: id,
    task_id: "task-" + id,
    instruction: "do the thing",
    system: "you are a test agent",
    tools: TOOLS,
    files: {},
    max_turns: 10,
    max_output_tokens: 256,
    temperature: 0.2,
    episode_timeout_s: null,
    ...overrides,
  };
}

export class Runner {
  // `script`: another copy of runner.mjs to run.
  constructor({ env = {}, cwd, nodeArgs = [], script = RUNNER } = {}) {
    this.spawnedAt = process.hrtime.bigint();
    this.child = spawn(process.execPath, [...nodeArgs, script], {
      cwd,
      env: { ...process.env, ...env },
      stdio: ["pipe", "pipe", "pipe"],
    });
    this.pid = this.child.pid;
    this.all = []; // every frame received, in order
    this.queue = []; // frames not yet consumed by next()
    this.waiters = [];
    this.stderr = "";
    this.helloAt = null;
    this.decodeError = null;
    this.stdoutEnded = false;
    this.stderrEnded = false;
    this.stdoutParts = [];
    this.child.stdout.setEncoding("latin1");
    this.child.stdout.on("data", (chunk) => this.#onStdout(chunk));
    this.child.stderr.setEncoding("utf8");
    this.child.stderr.on("data", (chunk) => {
      this.stderr += chunk;
      this.#wake();
    });
    this.child.stderr.on("end", () => {
      this.stderrEnded = true;
      this.#wake();
    });
    this.child.stdout.on("end", () => {
      this.stdoutEnded = true;
      this.#wake();
    });
    this.child.stdin.on("error", () => {}); // the runner may exit before we stop writing
    this.exited = new Promise((resolve) => {
      this.child.on("exit", (code, signal) => {
        this.exitInfo = { code, signal };
        this.#wake();
        resolve({ code, signal });
      });
    });
  }

  #onStdout(chunk) {
    let start = 0;
    let nl;
    while ((nl = chunk.indexOf("\n", start)) !== -1) {
      this.stdoutParts.push(chunk.slice(start, nl));
      const line = this.stdoutParts.join("");
      this.stdoutParts = [];
      start = nl + 1;
      if (line.trim() === "") continue;
      let frame;
      try {
        frame = decodeLine(line);
      } catch (e) {
        this.decodeError = e;
        continue;
      }
      frame.__line = line;
      if (frame.type === "hello" && this.helloAt === null) this.helloAt = process.hrtime.bigint();
      this.all.push(frame);
      this.queue.push(frame);
    }
    if (start < chunk.length) this.stdoutParts.push(chunk.slice(start));
    this.#wake();
  }

  #wake() {
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) w();
  }

  #changed() {
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  send(frame) {
    this.child.stdin.write(encodeFrame(frame));
  }

  write(text) {
    return new Promise((resolve, reject) => this.child.stdin.write(text, (err) => (err ? reject(err) : resolve())));
  }

  // Consumes frames until one satisfies `pred`; frames skipped on the way are
  // returned in `skipped`. Keepalives are skipped silently unless the predicate wants them.
  async waitFor(pred, { timeout = 5000, what = "a matching frame" } = {}) {
    const deadline = Date.now() + timeout;
    const skipped = [];
    for (;;) {
      if (this.decodeError) throw this.decodeError;
      while (this.queue.length > 0) {
        const frame = this.queue.shift();
        if (pred(frame)) {
          frame.skipped = skipped;
          return frame;
        }
        if (frame.type !== "transport_keepalive") skipped.push(frame);
      }
      if (this.stdoutEnded) {
        throw new Error(`runner closed stdout (${JSON.stringify(this.exitInfo)}) while waiting for ${what}; stderr:\n${this.stderr}`);
      }
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new Error(`timed out waiting for ${what}; skipped ${JSON.stringify(skipped.map(strip))}; stderr:\n${this.stderr}`);
      }
      let timer;
      await Promise.race([this.#changed(), new Promise((r) => (timer = setTimeout(r, left)))]);
      clearTimeout(timer);
    }
  }

  // The next non-keepalive frame, which must have the given type.
  async next(type, opts = {}) {
    const frame = await this.waitFor((f) => f.type !== "transport_keepalive", { what: `a ${type} frame`, ...opts });
    if (type !== undefined && frame.type !== type) {
      throw new Error(`expected a ${type} frame, got ${JSON.stringify(strip(frame)).slice(0, 2000)}; stderr:\n${this.stderr}`);
    }
    return frame;
  }

  // stderr is a separate pipe from stdout, so a diagnostic may arrive after
  // frames written later; wait for it instead of checking once.
  async stderrMatches(re, timeout = 5000) {
    const deadline = Date.now() + timeout;
    while (!re.test(this.stderr)) {
      const left = deadline - Date.now();
      if (left <= 0 || this.stderrEnded) {
        throw new Error(`stderr never matched ${re}; stderr:\n${this.stderr}`);
      }
      let timer;
      await Promise.race([this.#changed(), new Promise((r) => (timer = setTimeout(r, left)))]);
      clearTimeout(timer);
    }
  }

  hello() {
    return this.next("hello");
  }

  async exitCode(timeout = 5000) {
    let timer;
    const result = await Promise.race([
      this.exited,
      new Promise((_, reject) => (timer = setTimeout(() => reject(new Error("runner did not exit")), timeout))),
    ]);
    clearTimeout(timer);
    return result.code;
  }

  rssKb() {
    const status = readFileSync(`/proc/${this.pid}/status`, "utf8");
    const m = /VmRSS:\s+(\d+)\s+kB/.exec(status);
    return m ? Number(m[1]) : NaN;
  }

  async close() {
    if (!this.exitInfo) {
      this.child.stdin.end();
      try {
        await this.exitCode(3000);
      } catch {
        this.child.kill("SIGKILL");
        await this.exited;
      }
    }
  }
}

export function strip(frame) {
  const { __line, skipped, ...rest } = frame;
  return rest;
}

// Starts a runner, waits for its hello, and registers cleanup on the test context.
export async function startRunner(t, opts) {
  const r = new Runner(opts);
  t.after(() => r.close());
  await r.hello();
  return r;
}

// Answers an llm_request with a completion.
export function reply(r, req, comp) {
  r.send({ type: "llm_response", episode_id: req.episode_id, req_id: req.req_id, completion: comp });
}

export function toolReply(r, req, content, isError = false) {
  r.send({ type: "tool_response", episode_id: req.episode_id, req_id: req.req_id, content, is_error: isError });
}

// ---------------------------------------------------------------------------

const isMain = process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href;

if (isMain) {
  test("helper codec round-trips non-ASCII frames", () => {
    const frame = { type: "x", s: "café 🎉 naïve", n: 1 };
    const line = encodeFrame(frame);
    assert.ok(line.endsWith("\n"));
    assert.deepEqual(decodeLine(line.slice(0, -1)), frame);
  });

  test("helper decode is strict", () => {
    assert.throws(() => decodeLine("not base64!"));
    assert.throws(() => decodeLine(Buffer.from("[1]").toString("base64")));
  });
}
