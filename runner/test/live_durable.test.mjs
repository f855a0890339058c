// Tests of live.mjs over the durable outbox transport (protocol §3): what it
// commits to disk, its acks and nacks, and a host that loses stdout.

import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { completion, toolCall } from "./frames.test.mjs";
import { Live, framePath, llmReply, quiet, readOutbox, sessionStart, start, strip, tempDir, toolReply, until } from "./live_host.mjs";

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
  // A frame's file is committed before the head names it: wait for the head to catch up.
  const head = () => readFileSync(join(dir, "head"), "utf8");
  await until(() => head() === `${readOutbox(dir).length}\n`, "the head at the last frame");
  assert.equal(head(), `${readOutbox(dir).length}\n`);
  assert.match(readFileSync(join(dir, "stderr.log"), "utf8"), /stdout failed .*frames continue in the durable outbox/);
  assert.equal(r.exitInfo, undefined, "the runner is still alive");
  r.send({ type: "shutdown" }); // in 8
  assert.equal(await r.exitCode(), 0);
});
