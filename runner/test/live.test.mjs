// Tests of live.mjs, the live-session runner, over the stdio transport: its
// session, turns, steers and aborts. The durable transport: live_durable.test.mjs.

import { test } from "node:test";
import assert from "node:assert/strict";

import { FLAT_TOOLS, TOOLS, completion, encodeFrame, firstModelBody, toolCall } from "./frames.test.mjs";
import { Live, llmReply, quiet, ready, sessionStart, start, strip, submitTurn, toolReply, userTurn } from "./live_host.mjs";

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
    openai_body: firstModelBody("you are a live test agent", "list the files", { max_tokens: 256, temperature: 0.3 }),
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

test("three replies in a row without a tool call end the turn with no_tool_call", async (t) => {
  // (the nudges between them are the shared loop's: loop.test.mjs)
  const r = await ready(t);
  let req = await userTurn(r, "talk", "chat");
  for (const text of ["thinking out loud", "still talking"]) {
    llmReply(r, req, completion({ content: text }));
    req = await r.next("llm_request");
  }
  llmReply(r, req, completion({ content: "cut", finish: "length" }));
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
