import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, mkdirSync, writeFileSync, existsSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import {
  EPISODE_HELLO,
  FLAT_TOOLS,
  TOOLS,
  Runner,
  completion,
  encodeFrame,
  encodeJsonText,
  episodeStart,
  firstModelBody,
  reply,
  startRunner,
  strip,
  toolCall,
  toolReply,
} from "./frames.test.mjs";

function submitCall(id, answer) {
  return toolCall(id, "submit", { answer });
}

// The user-harness directories (one per distinct file set) under <root>/.wmo-harness.
function harnessDirs(root) {
  const base = join(root, ".wmo-harness");
  return existsSync(base) ? readdirSync(base).sort() : [];
}

function lastMessage(req) {
  const msgs = req.openai_body.messages;
  return msgs[msgs.length - 1];
}

// ---------------------------------------------------------------------------
// Start-up and wire format

test("hello carries the documented fields and nothing else", async (t) => {
  const r = await startRunner(t);
  assert.deepEqual(strip(r.all[0]), EPISODE_HELLO);
});

test("console output goes to stderr, never stdout", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "wmo-runner-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const r = await startRunner(t, { cwd: dir });
  const agent = `
    export async function runEpisode(ctx) {
      console.log("log line"); console.info("info line"); console.warn("warn line"); console.debug("debug line");
      process.stdout.write("raw stdout write\\n");
      ctx.submit("ok");
    }`;
  r.send(episodeStart("c1", { files: { "agent.mjs": agent } }));
  const done = await r.next("done");
  assert.equal(done.answer, "ok");
  for (const s of ["log line", "info line", "warn line", "debug line", "raw stdout write"]) {
    await r.stderrMatches(new RegExp(s));
  }
  assert.equal(r.decodeError, null);
});

test("non-ASCII text survives both directions; host ASCII escapes accepted", async (t) => {
  const r = await startRunner(t);
  const text = "café 🎉 naïve — 日本語";
  r.send(episodeStart("u1", { instruction: text, system: "système ✓" }));
  const req = await r.next("llm_request");
  assert.equal(req.openai_body.messages[1].content, text);
  assert.equal(req.openai_body.messages[0].content, "système ✓");
  // the runner emits raw UTF-8 JSON inside the base64
  const raw = Buffer.from(req.__line, "base64").toString("utf8");
  assert.ok(raw.includes("café 🎉"), "runner JSON should carry raw UTF-8");
  reply(r, req, completion({ toolCalls: [toolCall("c1", "bash", { cmd: "echo é🚀" })] }));
  const treq = await r.next("tool_request");
  assert.deepEqual(treq.arguments, { cmd: "echo é🚀" });
  // host-style JSON with ASCII escapes (é and a surrogate pair for 🚀)
  await r.write(
    encodeJsonText(
      `{"type":"tool_response","episode_id":"u1","req_id":${treq.req_id},"content":"caf\\u00e9 \\ud83d\\ude80","is_error":false}`
    )
  );
  const req2 = await r.next("llm_request");
  assert.equal(lastMessage(req2).content, "café 🚀");
  reply(r, req2, completion({ toolCalls: [submitCall("c2", "réponse ✓ 🎉")] }));
  const done = await r.next("done");
  assert.equal(done.answer, "réponse ✓ 🎉");
});

test("partial lines across writes and two frames in one write", async (t) => {
  const r = await startRunner(t);
  const line = encodeFrame(episodeStart("p1"));
  const a = Math.floor(line.length / 3);
  // a frame in three pieces, the newline arriving on its own
  await r.write(line.slice(0, a));
  await new Promise((res) => setTimeout(res, 20));
  await r.write(line.slice(a, line.length - 1));
  await new Promise((res) => setTimeout(res, 20));
  await r.write("\n");
  const req = await r.next("llm_request");
  assert.equal(req.episode_id, "p1");
  // reply, then (in the same write) a second episode_start that must be refused
  const both =
    encodeFrame({ type: "llm_response", episode_id: "p1", req_id: req.req_id, completion: completion({ toolCalls: [toolCall("c", "bash", { cmd: "ls" })] }) }) +
    encodeFrame(episodeStart("p2"));
  await r.write(both);
  const f1 = await r.next();
  const f2 = await r.next();
  const byType = Object.fromEntries([f1, f2].map((f) => [f.type, f]));
  assert.equal(byType.tool_request.episode_id, "p1");
  assert.equal(byType.episode_error.episode_id, "p2");
  // a frame whose line is split mid-way and glued to the start of the next frame
  const l1 = encodeFrame({ type: "tool_response", episode_id: "p1", req_id: byType.tool_request.req_id, content: "out", is_error: false });
  const l2 = encodeFrame({ type: "ping_unknown" });
  await r.write(l1.slice(0, 10));
  await r.write(l1.slice(10) + l2.slice(0, 5));
  await r.write(l2.slice(5));
  const req2 = await r.next("llm_request");
  assert.equal(lastMessage(req2).content, "out");
});

test("a multi-megabyte line round-trips", async (t) => {
  const r = await startRunner(t);
  const big = "x".repeat(3 * 1024 * 1024) + "é";
  r.send(episodeStart("big", { instruction: big }));
  const req = await r.next("llm_request", { timeout: 15000 });
  assert.equal(req.openai_body.messages[1].content, big);
  reply(r, req, completion({ toolCalls: [submitCall("s", big)] }));
  const done = await r.next("done", { timeout: 15000 });
  assert.equal(done.answer.length, big.length);
});

test("garbage lines are ignored and the next valid frame is handled", async (t) => {
  const r = await startRunner(t);
  const garbage =
    "!!! not base64 at all !!!\n" +
    "\n" +
    "   \r\n" +
    Buffer.from("[1,2,3]").toString("base64") + "\n" +
    Buffer.from("42").toString("base64") + "\n" +
    Buffer.from('"a string"').toString("base64") + "\n" +
    Buffer.from("{broken json").toString("base64") + "\n" +
    Buffer.from('{"no_type":true}').toString("base64") + "\n" +
    encodeFrame({ type: "some_future_frame", x: 1 }) +
    encodeFrame({ type: "hello_ack" }) +
    "  " + encodeFrame(episodeStart("g1")).trim() + "  \r\n"; // padded with whitespace
  await r.write(garbage);
  const req = await r.next("llm_request");
  assert.equal(req.episode_id, "g1");
  await r.stderrMatches(/not base64 JSON/);
  await r.stderrMatches(/not a JSON object/);
  await r.stderrMatches(/without a string type/);
  assert.equal(r.all.length, 2, "nothing but hello and the llm_request was written");
});

// ---------------------------------------------------------------------------
// Builtin harness: the loop itself is tested once, in loop.test.mjs; here, what
// it sends and how its outcomes end an episode on the wire.

test("a builtin episode on the wire: llm_request, tool_request, done; submit is never a tool_request", async (t) => {
  const r = await startRunner(t);
  r.send(episodeStart("b1", { max_turns: 7, max_output_tokens: 333, temperature: 0.4 }));
  const req1 = await r.next("llm_request");
  assert.deepEqual(strip(req1), {
    type: "llm_request",
    req_id: 1,
    episode_id: "b1",
    openai_body: firstModelBody("you are a test agent", "do the thing", { max_tokens: 333, temperature: 0.4 }),
  });
  reply(r, req1, completion({ content: "Let me look.", toolCalls: [toolCall("call_1", "bash", { cmd: "ls -la" })] }));
  const treq = await r.next("tool_request");
  assert.deepEqual(strip(treq), { type: "tool_request", req_id: 2, episode_id: "b1", name: "bash", arguments: { cmd: "ls -la" } });
  toolReply(r, treq, "file.txt", false);
  const req2 = await r.next("llm_request");
  assert.equal(req2.req_id, 3);
  assert.deepEqual(req2.openai_body.messages.slice(2), [
    { role: "assistant", content: "Let me look.", tool_calls: [toolCall("call_1", "bash", { cmd: "ls -la" })] },
    { role: "tool", tool_call_id: "call_1", content: "file.txt" },
  ]);
  reply(r, req2, completion({ toolCalls: [submitCall("call_2", "the answer")] }));
  const done = await r.next("done");
  assert.deepEqual(strip(done), { type: "done", episode_id: "b1", reason: "submit", answer: "the answer", turns: 2 });
  assert.equal(r.all.filter((f) => f.type === "tool_request" && f.name === "submit").length, 0, "submit is never a tool_request");
});

test("strict correlation: wrong reply kind, unknown req_id and wrong episode are ignored", async (t) => {
  const r = await startRunner(t);
  r.send(episodeStart("k1"));
  const req = await r.next("llm_request");
  reply(r, req, completion({ toolCalls: [toolCall("a", "bash", { cmd: "x" })] }));
  const treq = await r.next("tool_request");
  // right req_id but sent as an llm_response
  r.send({ type: "llm_response", episode_id: "k1", req_id: treq.req_id, completion: completion({ toolCalls: [submitCall("z", "WRONG")] }) });
  // right kind, unknown req_id
  r.send({ type: "tool_response", episode_id: "k1", req_id: 9999, content: "stray", is_error: false });
  // right kind and req_id, but another episode's id
  r.send({ type: "tool_response", episode_id: "other", req_id: treq.req_id, content: "foreign", is_error: false });
  // req_id as a string is not a match
  r.send({ type: "tool_response", episode_id: "k1", req_id: String(treq.req_id), content: "stringly", is_error: false });
  toolReply(r, treq, "real");
  const req2 = await r.next("llm_request");
  assert.equal(lastMessage(req2).content, "real");
  await r.stderrMatches(/awaits a tool_response/);
  await r.stderrMatches(/no pending request has that id/);
  // a duplicate of the already-consumed reply is ignored too
  toolReply(r, treq, "duplicate");
  reply(r, req2, completion({ toolCalls: [submitCall("s", "done")] }));
  const done = await r.next("done");
  assert.equal(done.answer, "done");
});

test("how a builtin episode ends: the done reason, the last text, the model calls", async (t) => {
  const r = await startRunner(t);
  const done = async () => strip(await r.next("done"));
  const expect = (id, reason, answer, turns) => ({ type: "done", episode_id: id, reason, answer, turns });
  // the turn cap, reached after tool calls
  r.send(episodeStart("m1", { max_turns: 2 }));
  for (let i = 0; i < 2; i++) {
    reply(r, await r.next("llm_request"), completion({ content: `turn ${i}`, toolCalls: [toolCall(`c${i}`, "bash", { cmd: "x" })] }));
    toolReply(r, await r.next("tool_request"), "ok");
  }
  assert.deepEqual(await done(), expect("m1", "max_turns", "turn 1", 2));
  // a reply without a tool call on the last allowed turn: its own classification
  r.send(episodeStart("m2", { max_turns: 1 }));
  reply(r, await r.next("llm_request"), completion({ content: "long", finish: "length" }));
  assert.deepEqual(await done(), expect("m2", "output_truncated", "long", 1));
  // three replies in a row without a tool call
  r.send(episodeStart("n1"));
  for (const text of ["I think 4.", "Still 4.", "   "]) reply(r, await r.next("llm_request"), completion({ content: text }));
  assert.deepEqual(await done(), expect("n1", "no_tool_call", "Still 4.", 3));
  // a failed model call
  r.send(episodeStart("pe"));
  reply(r, await r.next("llm_request"), completion({ content: "  thinking hard  ", toolCalls: [toolCall("a", "bash", { cmd: "x" })] }));
  toolReply(r, await r.next("tool_request"), "out");
  const req = await r.next("llm_request");
  r.send({ type: "llm_response", episode_id: "pe", req_id: req.req_id, error: "429 rate limited" });
  assert.deepEqual(await done(), expect("pe", "provider_error", "thinking hard", 2));
  // a completion without a message: provider_error, and stderr says why
  r.send(episodeStart("pc"));
  const req2 = await r.next("llm_request");
  r.send({ type: "llm_response", episode_id: "pc", req_id: req2.req_id, completion: { choices: [] } });
  assert.deepEqual(await done(), expect("pc", "provider_error", "", 1));
  await r.stderrMatches(/episode pc: llm_response \d+ carried no completion\.choices\[0\]\.message/);
});

// ---------------------------------------------------------------------------
// Keepalive, concurrency, shutdown

test("keepalive frames flow during an episode and stop after it", async (t) => {
  const r = await startRunner(t, { env: { WMO_KEEPALIVE_MS: "50" } });
  r.send(episodeStart("ka"));
  const req = await r.next("llm_request");
  for (let i = 0; i < 3; i++) {
    const ka = await r.waitFor((f) => f.type === "transport_keepalive", { what: "a keepalive" });
    assert.deepEqual(strip(ka), { type: "transport_keepalive" });
  }
  reply(r, req, completion({ toolCalls: [submitCall("s", "x")] }));
  await r.next("done");
  const count = r.all.length;
  await new Promise((res) => setTimeout(res, 300)); // six intervals
  assert.equal(r.all.length, count, "no frames after the episode ended");
});

test("a second episode_start while one runs gets episode_error", async (t) => {
  const r = await startRunner(t);
  r.send(episodeStart("first"));
  const req = await r.next("llm_request");
  r.send(episodeStart("second"));
  const err = await r.next("episode_error");
  assert.equal(err.episode_id, "second");
  assert.match(err.note, /already running/);
  reply(r, req, completion({ toolCalls: [submitCall("s", "one")] }));
  const done = await r.next("done");
  assert.deepEqual([done.episode_id, done.answer], ["first", "one"]);
  // once the first ended, a new one is accepted
  r.send(episodeStart("third"));
  assert.equal((await r.next("llm_request")).episode_id, "third");
});

test("shutdown exits 0", async (t) => {
  const r = await startRunner(t);
  r.send({ type: "shutdown" });
  assert.equal(await r.exitCode(), 0);
});

test("stdin EOF exits 0, also mid-episode", async (t) => {
  const r = await startRunner(t);
  r.child.stdin.end();
  assert.equal(await r.exitCode(), 0);
  const r2 = await startRunner(t, { env: { WMO_KEEPALIVE_MS: "20" } });
  r2.send(episodeStart("eof"));
  await r2.next("llm_request");
  r2.child.stdin.end();
  assert.equal(await r2.exitCode(), 0);
});

test("too-old Node exits 3 with a message", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "wmo-runner-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const preload = join(dir, "old-node.cjs");
  writeFileSync(preload, 'Object.defineProperty(process, "version", { value: "v16.20.2" });\n');
  const r = new Runner({ nodeArgs: ["--require", preload] });
  t.after(() => r.close());
  assert.equal(await r.exitCode(), 3);
  await r.stderrMatches(/wmo-e2b runner needs Node\.js >= 18 \(found v16\.20\.2\)/);
  assert.equal(r.all.length, 0, "no hello from a too-old Node");
});

// ---------------------------------------------------------------------------
// User harness

test("user harness: ctx.llm, ctx.tool, ctx.submit, ctx.log and extra files", async (t) => {
  const root = mkdtempSync(join(tmpdir(), "wmo-runner-"));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  const r = await startRunner(t, { cwd: root });
  const agent = `
import { shout } from "./lib/util.mjs";
import { readFileSync } from "node:fs";
export async function runEpisode(ctx) {
  const data = readFileSync(new URL("./data/notes.txt", import.meta.url), "utf8");
  ctx.log(shout(ctx.taskId) + " " + ctx.maxTurns + " " + ctx.maxOutputTokens + " " + data + " " + ctx.tools.length);
  const c = await ctx.llm({ messages: [{ role: "system", content: ctx.system }, { role: "user", content: ctx.instruction }], tools: ctx.tools });
  const r = await ctx.tool("bash", { cmd: c.choices[0].message.content });
  ctx.log("tool said " + r.content + " " + r.isError);
  let err = "none";
  try { await ctx.llm({ messages: [] }); } catch (e) { err = e.message; }
  ctx.submit("answer:" + r.content + ":" + err);
  ctx.submit("second submit is a no-op");
  ctx.log("after submit: dropped");
  return "ignored";
}`;
  r.send(
    episodeStart("h1", {
      instruction: "say hi",
      max_turns: 9,
      files: { "agent.mjs": agent, "lib/util.mjs": "export const shout = (s) => s.toUpperCase();", "data/notes.txt": "nötes" },
    })
  );
  const log1 = await r.next("log");
  assert.deepEqual(strip(log1), { type: "log", episode_id: "h1", message: "TASK-H1 9 256 nötes 4" });
  const req = await r.next("llm_request");
  assert.deepEqual(req.openai_body, {
    messages: [{ role: "system", content: "you are a test agent" }, { role: "user", content: "say hi" }],
    tools: TOOLS,
  });
  reply(r, req, completion({ content: "echo hi" }));
  const treq = await r.next("tool_request");
  assert.deepEqual(strip(treq), { type: "tool_request", req_id: treq.req_id, episode_id: "h1", name: "bash", arguments: { cmd: "echo hi" } });
  toolReply(r, treq, "hi", true);
  const log2 = await r.next("log");
  assert.equal(log2.message, "tool said hi true");
  const req2 = await r.next("llm_request");
  r.send({ type: "llm_response", episode_id: "h1", req_id: req2.req_id, error: "upstream 500" });
  const done = await r.next("done");
  assert.deepEqual(strip(done), { type: "done", episode_id: "h1", reason: "submit", answer: "answer:hi:upstream 500", turns: 2 });
  // the harness lives under .wmo-harness/<hash>/ for the runner's lifetime, not per episode
  const dirs = harnessDirs(root);
  assert.equal(dirs.length, 1, `one harness directory: ${dirs}`);
  assert.equal(readFileSync(join(root, ".wmo-harness", dirs[0], "data", "notes.txt"), "utf8"), "nötes");
  assert.deepEqual(readdirSync(root), [".wmo-harness"], "no per-episode directory");
  // nothing more from that episode: the next frame belongs to a new one
  r.send(episodeStart("h2"));
  assert.equal((await r.next()).episode_id, "h2");
  r.send({ type: "shutdown" });
  assert.equal(await r.exitCode(), 0);
  assert.deepEqual(readdirSync(root), [], "nothing left after the runner exits");
});

test("user harness returning without submit: done no_tool_call with its string result", async (t) => {
  const root = mkdtempSync(join(tmpdir(), "wmo-runner-"));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  const r = await startRunner(t, { cwd: root });
  r.send(episodeStart("r1", { files: { "agent.mjs": "export async function runEpisode() { return 'my result'; }" } }));
  const done = await r.next("done");
  assert.deepEqual(strip(done), { type: "done", episode_id: "r1", reason: "no_tool_call", answer: "my result", turns: 0 });
  r.send(episodeStart("r2", { files: { "agent.mjs": "export function runEpisode() { return 42; }" } }));
  const done2 = await r.next("done");
  assert.deepEqual([done2.reason, done2.answer], ["no_tool_call", ""]);
  assert.equal(harnessDirs(root).length, 2, "one directory per distinct harness");
  r.child.stdin.end();
  assert.equal(await r.exitCode(), 0);
  assert.deepEqual(readdirSync(root), [], "nothing left after the runner exits");
});

test("user harness that throws, or lacks runEpisode, or fails to import: episode_error", async (t) => {
  const root = mkdtempSync(join(tmpdir(), "wmo-runner-"));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  const r = await startRunner(t, { cwd: root });
  const cases = [
    ["x1", "export async function runEpisode(ctx) { ctx.log('before'); throw new Error('kaboom'); }", /kaboom/],
    ["x2", "export const somethingElse = 1;", /runEpisode/],
    ["x3", "export function runEpisode( {", /SyntaxError/],
    // an error thrown from a timer inside the harness fails the episode, not the runner
    ["x4", "export function runEpisode() { setTimeout(() => { throw new Error('late'); }, 1); return new Promise(() => {}); }", /late/],
    // the same broken harness again fails the same way
    ["x6", "export function runEpisode( {", /SyntaxError/],
  ];
  for (const [id, agent, re] of cases) {
    r.send(episodeStart(id, { files: { "agent.mjs": agent } }));
    if (id === "x1") await r.next("log"); // it logged before it threw
    const err = await r.next("episode_error");
    assert.equal(err.episode_id, id);
    assert.match(err.note, re);
  }
  assert.deepEqual(readdirSync(root), [".wmo-harness"]);
  // the runner still works
  r.send(episodeStart("x5"));
  assert.equal((await r.next("llm_request")).episode_id, "x5");
  r.send({ type: "shutdown" });
  assert.equal(await r.exitCode(), 0);
  assert.deepEqual(readdirSync(root), [], "nothing left after the runner exits");
});

test("path traversal in files is refused and nothing is written", async (t) => {
  const root = mkdtempSync(join(tmpdir(), "wmo-runner-"));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  const cwd = join(root, "cwd");
  writeFileSync(join(root, "marker"), "");
  mkdirSync(cwd);
  const r = await startRunner(t, { cwd });
  const agent = "export async function runEpisode(ctx) { ctx.submit('should not run'); }";
  const abs = join(root, "abs-target.txt");
  const cases = [
    ["../x", /"\.\.\/x".*'\.\.' component/],
    [abs, /absolute/],
    ["sub/../../y", /'\.\.' component/],
    ["", /empty/],
    [".", /outside the harness directory/],
  ];
  let n = 0;
  for (const [rel, re] of cases) {
    const id = "t" + n++;
    r.send(episodeStart(id, { files: { "agent.mjs": agent, "ok.txt": "fine", [rel]: "pwned" } }));
    const err = await r.next("episode_error");
    assert.equal(err.episode_id, id);
    assert.ok(err.note.includes(JSON.stringify(rel)), `note names the path: ${err.note}`);
    assert.match(err.note, re);
  }
  assert.ok(!existsSync(join(root, "x")));
  assert.ok(!existsSync(join(root, "y")));
  assert.ok(!existsSync(abs));
  assert.deepEqual(readdirSync(cwd), [], "no harness directory written for a refused file set");
  assert.deepEqual(readdirSync(root).sort(), ["cwd", "marker"]);
  // a valid harness after the refusals still runs; its files stay under .wmo-harness/<hash>/
  r.send(episodeStart("ok", { files: { "agent.mjs": agent, "ok.txt": "fine" } }));
  assert.equal((await r.next("done")).answer, "should not run");
  const dirs = harnessDirs(cwd);
  assert.equal(dirs.length, 1);
  assert.deepEqual(readdirSync(join(cwd, ".wmo-harness", dirs[0])).sort(), ["agent.mjs", "ok.txt"]);
  r.send({ type: "shutdown" });
  assert.equal(await r.exitCode(), 0);
  assert.deepEqual(readdirSync(cwd), [], "nothing left after the runner exits");
  assert.deepEqual(readdirSync(root).sort(), ["cwd", "marker"]);
});

test("an episode_start the runner cannot honour ends in episode_error, never in another harness", async (t) => {
  const root = mkdtempSync(join(tmpdir(), "wmo-runner-"));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  const r = await startRunner(t, { cwd: root });
  const agent = "export async function runEpisode(ctx) { ctx.submit('ran'); }";
  const cases = [
    // the reference runner's harness files: this runner cannot run them
    [{ files: { "src/agent.ts": "export class Agent {}", "../evil": "y" } }, /hold no agent\.mjs.*cannot run src\/agent\.ts/],
    [{ files: { "lib/x.mjs": "" } }, /\("lib\/x\.mjs"\) hold no agent\.mjs/],
    [{ harness: "user", files: {} }, /user harness was named but no files/],
    [{ harness: "builtin", files: { "agent.mjs": agent } }, /builtin harness was named, but harness files \("agent\.mjs"\) came too/],
    [{ harness: "pi", files: { "agent.mjs": agent } }, /pi harness was named, but harness files/],
    [{ files: ["agent.mjs"] }, /files is not an object/],
    [{ harness: "mystery" }, /unknown harness "mystery"/],
    // a tool spec of no known shape (every shape: tool_specs.test.mjs)
    [{ tools: [...TOOLS, { name: 5 }] }, /tool spec 4 has an unknown shape \(it has no name\): \{"name":5\}/],
  ];
  let n = 0;
  for (const [overrides, re] of cases) {
    const id = "h" + n++;
    r.send(episodeStart(id, overrides));
    // the refusal is the very next frame: no model call, no tool call, no done
    const err = await r.next("episode_error");
    assert.equal(err.episode_id, id);
    assert.match(err.note, /^cannot run this episode_start: /);
    assert.match(err.note, re, JSON.stringify(overrides));
  }
  assert.deepEqual(readdirSync(root), [], "nothing was written for a refused episode");
  // the runner is idle and takes the next episode
  r.send(episodeStart("fine"));
  const req = await r.next("llm_request");
  reply(r, req, completion({ toolCalls: [submitCall("s", "a")] }));
  assert.equal((await r.next("done")).reason, "submit");
});

test("flat tool specs (the reference's shape) reach the model, and a user harness, in OpenAI's shape", async (t) => {
  const root = mkdtempSync(join(tmpdir(), "wmo-runner-"));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  const r = await startRunner(t, { cwd: root });
  r.send(episodeStart("flat", { tools: FLAT_TOOLS }));
  const req = await r.next("llm_request");
  assert.deepEqual(req.openai_body.tools, TOOLS);
  reply(r, req, completion({ toolCalls: [submitCall("s", "done")] }));
  assert.equal((await r.next("done")).reason, "submit");
  const agent = "export async function runEpisode(ctx) { ctx.submit(JSON.stringify(ctx.tools)); }";
  r.send(episodeStart("user", { tools: FLAT_TOOLS, files: { "agent.mjs": agent } }));
  assert.deepEqual(JSON.parse((await r.next("done")).answer), TOOLS);
});

test("shutdown or EOF mid user-harness episode still removes its directory", async (t) => {
  const root = mkdtempSync(join(tmpdir(), "wmo-runner-"));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  const agent = "export async function runEpisode(ctx) { await ctx.tool('bash', { cmd: 'sleep' }); }";
  for (const how of ["shutdown", "eof", "stdout closed"]) {
    const r = await startRunner(t, { cwd: root });
    r.send(episodeStart("d-" + how, { files: { "agent.mjs": agent } }));
    await r.next("tool_request");
    const dirs = harnessDirs(root);
    assert.equal(dirs.length, 1);
    assert.ok(existsSync(join(root, ".wmo-harness", dirs[0], "agent.mjs")));
    if (how === "shutdown") r.send({ type: "shutdown" });
    else if (how === "eof") r.child.stdin.end();
    else {
      // the host stops reading: the runner's next frame write fails and it exits
      r.child.stdout.destroy();
      r.send(episodeStart("d-after", { files: { "agent.mjs": agent } }));
    }
    assert.equal(await r.exitCode(), 0);
    assert.deepEqual(readdirSync(root), [], `nothing left after ${how}`);
  }
});

test("a harness calling process.exit still leaves nothing behind", async (t) => {
  const root = mkdtempSync(join(tmpdir(), "wmo-runner-"));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  const r = await startRunner(t, { cwd: root });
  r.send(episodeStart("pe", { files: { "agent.mjs": "export function runEpisode() { process.exit(7); }" } }));
  assert.equal(await r.exitCode(), 7);
  assert.deepEqual(readdirSync(root), []);
});

test("episode_start defaults: missing limits fall back, missing temperature is omitted", async (t) => {
  const r = await startRunner(t);
  r.send({ type: "episode_start", episode_id: "def", instruction: "i", system: "s", tools: TOOLS });
  const req = await r.next("llm_request");
  assert.deepEqual(Object.keys(req.openai_body).sort(), ["max_tokens", "messages", "tools"]);
  assert.equal(req.openai_body.max_tokens, 4096);
  reply(r, req, completion({ toolCalls: [toolCall("s", "submit", {})] }));
  const done = await r.next("done");
  assert.deepEqual([done.reason, done.answer], ["submit", ""]);
  r.send({ type: "episode_start", instruction: "no id" });
  const err = await r.next("episode_error");
  assert.equal(err.episode_id, null);
  assert.match(err.note, /episode_id/);
});
