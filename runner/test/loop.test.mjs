// The builtin tool-calling loop (runner/loop.mjs), the one both runners run:
// its transcript, nudges, limits and outcomes, driven in-process by a test
// host that answers each model and tool call itself. What each outcome means
// on the wire is tested with each runner (runner.test.mjs, live.test.mjs).

import { test } from "node:test";
import assert from "node:assert/strict";

import { runToolLoop } from "../loop.mjs";
import { NUDGE_TAIL, TOOLS, completion, toolCall } from "./frames.test.mjs";

const WAIT_MS = 2000;
const NO_CALL_NUDGE = "[ERROR] Your reply contained no tool call. " + NUDGE_TAIL;

// A host for one run of the loop: every model and tool call waits until the
// test answers it, so the test sees each call, in order, and what it carried.
class Host {
  constructor({ submitOnHost = false, cut = false } = {}) {
    this.queue = []; // calls not yet taken by next()
    this.waiters = [];
    this.outstanding = 0; // calls made and not yet answered
    this.mostOutstanding = 0;
    this.steers = [];
    this.cut = cut;
    this.nextReqId = 1;
    this.adapter = {
      callModel: (body) => this.call({ kind: "model", body: structuredClone(body) }),
      callTool: (name, args) => this.call({ kind: "tool", name, args: structuredClone(args) }),
      cutOff: () => this.cut,
      interrupted: (reply) => reply.interrupt === true,
      takeUserInput: () => this.steers.splice(0),
      hasUserInput: () => this.steers.length > 0,
      submitOnHost,
    };
  }

  call(entry) {
    this.outstanding += 1;
    this.mostOutstanding = Math.max(this.mostOutstanding, this.outstanding);
    return new Promise((resolve) => {
      entry.answer = (reply) => {
        this.outstanding -= 1;
        resolve(reply);
      };
      this.queue.push(entry);
      for (const w of this.waiters.splice(0)) w();
    });
  }

  // The next call the loop made, which must be of `kind`.
  async next(kind) {
    const deadline = Date.now() + WAIT_MS;
    while (this.queue.length === 0) {
      if (Date.now() > deadline) throw new Error(`the loop made no ${kind} call`);
      let timer;
      await Promise.race([new Promise((r) => this.waiters.push(r)), new Promise((r) => (timer = setTimeout(r, WAIT_MS)))]);
      clearTimeout(timer);
    }
    const entry = this.queue.shift();
    assert.equal(entry.kind, kind, `expected a ${kind} call, got ${JSON.stringify(entry)}`);
    return entry;
  }

  // Answers a model call with a completion.
  reply(call, comp) {
    call.answer({ type: "llm_response", req_id: this.nextReqId++, completion: comp });
  }

  toolReply(call, content, extra = {}) {
    call.answer({ type: "tool_response", content, is_error: false, ...extra });
  }
}

// Starts one run of the loop; `done` is its outcome.
function start(conv = {}, hostOpts) {
  const host = new Host(hostOpts);
  const run = { turns: 0 };
  const messages = [
    { role: "system", content: "sys" },
    { role: "user", content: "do it" },
  ];
  const full = { messages, tools: TOOLS, maxOutputTokens: 256, temperature: 0.2, turnCap: 10, ...conv };
  const done = runToolLoop(full, run, host.adapter);
  return { host, run, conv: full, done };
}

function submitCall(id, answer) {
  return toolCall(id, "submit", { answer });
}

// Answers `n` model calls in a row with text only, returning the last body seen.
async function textReplies(host, texts) {
  let call;
  for (const text of texts) {
    call = await host.next("model");
    host.reply(call, completion({ content: text }));
  }
  return call;
}

test("a tool call, its result, then submit: the body, the transcript, the outcome", async () => {
  const { host, run, done } = start({ temperature: 0.4 });
  const first = await host.next("model");
  assert.deepEqual(first.body, {
    messages: [
      { role: "system", content: "sys" },
      { role: "user", content: "do it" },
    ],
    tools: TOOLS,
    max_tokens: 256,
    temperature: 0.4,
  });
  host.reply(first, completion({ content: "Let me look.", toolCalls: [toolCall("c1", "bash", { cmd: "ls" })] }));
  const tool = await host.next("tool");
  assert.deepEqual([tool.name, tool.args], ["bash", { cmd: "ls" }]);
  host.toolReply(tool, { files: ["a"] }); // a non-string result reaches the model as JSON
  const second = await host.next("model");
  assert.deepEqual(second.body.messages.slice(2), [
    { role: "assistant", content: "Let me look.", tool_calls: [toolCall("c1", "bash", { cmd: "ls" })] },
    { role: "tool", tool_call_id: "c1", content: '{"files":["a"]}' },
  ]);
  host.reply(second, completion({ content: [{ type: "text", text: "Done: " }, { type: "text", text: "a" }], toolCalls: [submitCall("c2", "the answer")] }));
  assert.deepEqual(await done, { end: "submit", answer: "the answer", lastText: "Done: a" });
  assert.equal(run.turns, 2);
  assert.equal(host.queue.length, 0, "submit never reaches the host");
});

test("without a temperature the body has none; a missing one is never sent as null", async () => {
  const { host } = start({ temperature: undefined });
  const call = await host.next("model");
  assert.deepEqual(Object.keys(call.body).sort(), ["max_tokens", "messages", "tools"]);
});

test("the tool calls of one reply run one at a time, in order; calls after submit never run", async () => {
  const { host, done } = start();
  host.reply(await host.next("model"), completion({
    toolCalls: [toolCall("a", "bash", { cmd: "one" }), toolCall("b", "read_file", { path: "two" }), submitCall("c", "fin"), toolCall("d", "bash", { cmd: "never" })],
  }));
  const one = await host.next("tool");
  assert.equal(one.args.cmd, "one");
  host.toolReply(one, "first");
  const two = await host.next("tool");
  assert.deepEqual([two.name, two.args], ["read_file", { path: "two" }]);
  host.toolReply(two, "second", { is_error: true });
  assert.deepEqual(await done, { end: "submit", answer: "fin", lastText: "" });
  assert.equal(host.mostOutstanding, 1, "never more than one call outstanding");
  assert.equal(host.queue.length, 0, "nothing ran after submit");
});

test("submitOnHost: submit is a tool call carrying its answer as a string; the run ends once it is answered", async () => {
  const { host, conv, done } = start({}, { submitOnHost: true });
  host.reply(await host.next("model"), completion({ toolCalls: [submitCall("s", { k: [1] }), toolCall("x", "bash", { cmd: "never" })] }));
  const sub = await host.next("tool");
  assert.deepEqual([sub.name, sub.args], ["submit", { answer: '{"k":[1]}' }]);
  host.toolReply(sub, "submitted");
  assert.deepEqual(await done, { end: "submit", answer: '{"k":[1]}', lastText: "" });
  assert.deepEqual(conv.messages.at(-1), { role: "tool", tool_call_id: "s", content: "submitted" });
  assert.equal(host.queue.length, 0, "the call after submit never ran");
});

test("arguments that are not a JSON object: a tool error in the transcript, and the loop goes on", async () => {
  const { host, done } = start();
  host.reply(await host.next("model"), completion({
    toolCalls: [
      toolCall("a", "bash", "{not json"),
      toolCall("b", "bash", { cmd: "ok" }),
      toolCall("c", "bash", "[1,2]"),
      toolCall("d", "bash", ""),
      { id: "e", type: "function", function: { name: "bash", arguments: { cmd: "object" } } },
    ],
  }));
  const ok = await host.next("tool");
  assert.deepEqual(ok.args, { cmd: "ok" });
  host.toolReply(ok, "fine");
  const empty = await host.next("tool");
  assert.deepEqual(empty.args, {}, "an empty arguments string reads as {}");
  host.toolReply(empty, "empty");
  const obj = await host.next("tool");
  assert.deepEqual(obj.args, { cmd: "object" }, "arguments given as an object are taken as they are");
  host.toolReply(obj, "obj");
  const next = await host.next("model");
  const results = next.body.messages.filter((m) => m.role === "tool");
  assert.deepEqual(results.map((m) => m.tool_call_id), ["a", "b", "c", "d", "e"]);
  assert.match(results[0].content, /^error: could not parse the arguments of bash as JSON: \S/);
  assert.equal(results[1].content, "fine");
  assert.match(results[2].content, /^error: could not parse the arguments of bash as JSON: expected a JSON object, got an array$/);
  // a submit with bad arguments is reported, not run
  host.reply(next, completion({ toolCalls: [toolCall("s", "submit", "{oops")] }));
  const after = await host.next("model");
  assert.match(after.body.messages.at(-1).content, /^error: could not parse the arguments of submit as JSON/);
  host.reply(after, completion({ toolCalls: [toolCall("t", "submit", {})] }));
  assert.deepEqual(await done, { end: "submit", answer: "", lastText: "" });
});

test("replies without a tool call are nudged; the third in a row ends the run with its classification", async () => {
  const { host, run, done } = start({ maxOutputTokens: 512 });
  host.reply(await host.next("model"), completion({ content: "I think it is 4." }));
  let call = await host.next("model");
  assert.deepEqual(call.body.messages.slice(2), [
    { role: "assistant", content: "I think it is 4." },
    { role: "user", content: NO_CALL_NUDGE },
  ]);
  // a truncated reply's tool calls are neither run nor echoed back
  host.reply(call, completion({ content: "writing", toolCalls: [toolCall("w", "write_file", '{"path":"x","cont')], finish: "length" }));
  call = await host.next("model");
  assert.deepEqual(call.body.messages.slice(4), [
    { role: "assistant", content: "writing" },
    {
      role: "user",
      content:
        "[ERROR] None of the requested actions ran because the reply exceeded 512 output tokens. " +
        "Re-issue the work in chunks well under that limit. " + NUDGE_TAIL,
    },
  ]);
  host.reply(call, completion({ content: null, extra: { wmo_unparsed_tool_calls: ["unclosed <tool_call> block", { at: 3 }] } }));
  assert.deepEqual(await done, { end: "no_action", why: "unparsed_tool_call", lastText: "writing" });
  assert.equal(run.turns, 3);
  assert.equal(host.queue.length, 0, "no tool ever ran");
});

test("the unparsed-tool-call nudge quotes the parser; a reply without content is echoed as empty text", async () => {
  const { host } = start();
  host.reply(await host.next("model"), completion({ content: null, extra: { wmo_unparsed_tool_calls: ["unclosed <tool_call> block", { at: 3 }] } }));
  const call = await host.next("model");
  assert.deepEqual(call.body.messages.slice(2), [
    { role: "assistant", content: "" },
    {
      role: "user",
      content:
        '[ERROR] Nothing was executed. The tool-call parser reported: unclosed <tool_call> block; {"at":3}. ' +
        "Emit the call again in the documented format, closing every block. " + NUDGE_TAIL,
    },
  ]);
});

test("a tool call resets the streak of replies without one", async () => {
  const { host, run, done } = start();
  await textReplies(host, ["prose", "prose"]);
  host.reply(await host.next("model"), completion({ toolCalls: [toolCall("a", "bash", { cmd: "x" })] }));
  host.toolReply(await host.next("tool"), "ok");
  const afterTool = await host.next("model");
  assert.equal(afterTool.body.messages.at(-1).role, "tool", "no nudge after a tool call");
  host.reply(afterTool, completion({ content: "prose again" }));
  await textReplies(host, ["  ", "   "]);
  assert.deepEqual(await done, { end: "no_action", why: "no_tool_call", lastText: "prose again" });
  assert.equal(run.turns, 6);
});

test("the turn cap: reached after tool calls it ends the run; a text reply on the last turn keeps its classification", async () => {
  const capped = start({ turnCap: 2 });
  for (let i = 0; i < 2; i++) {
    capped.host.reply(await capped.host.next("model"), completion({ content: `turn ${i}`, toolCalls: [toolCall(`c${i}`, "bash", { cmd: "x" })] }));
    capped.host.toolReply(await capped.host.next("tool"), "ok");
  }
  assert.deepEqual(await capped.done, { end: "turn_cap", why: null, lastText: "turn 1" });
  assert.equal(capped.run.turns, 2);

  const last = start({ turnCap: 1 });
  last.host.reply(await last.host.next("model"), completion({ content: "cut", finish: "length" }));
  assert.deepEqual(await last.done, { end: "turn_cap", why: "output_truncated", lastText: "cut" });
  assert.equal(last.conv.messages.at(-1).role, "assistant", "no nudge after the last allowed call");
});

test("a failed model call, or a completion without a message, ends the run; each counts as a model call", async () => {
  const failed = start();
  failed.host.reply(await failed.host.next("model"), completion({ content: "  thinking  ", toolCalls: [toolCall("a", "bash", { cmd: "x" })] }));
  failed.host.toolReply(await failed.host.next("tool"), "out");
  (await failed.host.next("model")).answer({ type: "llm_response", req_id: 9, error: { status: 429 } });
  assert.deepEqual(await failed.done, { end: "model_failed", note: '{"status":429}', malformed: false, lastText: "thinking" });
  assert.equal(failed.run.turns, 2);

  for (const comp of [{ choices: [] }, { choices: [{ message: [] }] }, null]) {
    const bad = start();
    (await bad.host.next("model")).answer({ type: "llm_response", req_id: 7, completion: comp });
    assert.deepEqual(await bad.done, {
      end: "model_failed",
      note: "llm_response 7 carried no completion.choices[0].message",
      malformed: true,
      lastText: "",
    });
    assert.equal(bad.run.turns, 1);
  }
});

test("user input that arrives during a run joins before the next model call and restarts the nudge budget", async () => {
  const { host, done } = start();
  const first = await textReplies(host, ["prose 0", "prose 1"]);
  assert.equal(first.body.messages.at(-1).content, NO_CALL_NUDGE);
  host.steers.push("what did you find?");
  // the third text-only reply in a row: pending input stands in for the nudge
  host.reply(await host.next("model"), completion({ content: "prose 2" }));
  const steered = await host.next("model");
  assert.deepEqual(steered.body.messages.slice(-2), [
    { role: "assistant", content: "prose 2" },
    { role: "user", content: "what did you find?" },
  ]);
  // the budget started over: two more text replies are nudged, the third ends the run
  host.reply(steered, completion({ content: "prose 3" }));
  const nudged = await textReplies(host, ["prose 4"]);
  assert.equal(nudged.body.messages.at(-1).content, NO_CALL_NUDGE);
  await textReplies(host, ["prose 5"]);
  assert.deepEqual(await done, { end: "no_action", why: "no_tool_call", lastText: "prose 5" });
});

test("a run cut off while a call is pending, or by the host's interrupt marker, ends cut_off", async () => {
  const model = start();
  const call = await model.host.next("model");
  model.host.cut = true;
  call.answer(null);
  assert.deepEqual(await model.done, { end: "cut_off", lastText: "" });
  assert.equal(model.run.turns, 0, "an unanswered model call does not count");

  const interrupted = start();
  (await interrupted.host.next("model")).answer({ type: "llm_response", req_id: 1, error: "interrupted", interrupt: true });
  assert.deepEqual(await interrupted.done, { end: "cut_off", lastText: "" });
  assert.equal(interrupted.run.turns, 0);

  // an interrupted tool result is kept in the transcript; the calls after it never run
  const tool = start();
  tool.host.reply(await tool.host.next("model"), completion({ toolCalls: [toolCall("a", "bash", { cmd: "sleep" }), toolCall("b", "bash", { cmd: "ls" })] }));
  tool.host.toolReply(await tool.host.next("tool"), "interrupted", { is_error: true, interrupt: true });
  assert.deepEqual(await tool.done, { end: "cut_off", lastText: "" });
  assert.deepEqual(tool.conv.messages.at(-1), { role: "tool", tool_call_id: "a", content: "interrupted" });
  assert.equal(tool.host.queue.length, 0);

  const before = start({}, { cut: true });
  assert.deepEqual(await before.done, { end: "cut_off", lastText: "" });
  assert.equal(before.host.queue.length, 0, "a run cut off before it starts calls nothing");
});
