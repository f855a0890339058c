// Long-running checks: 500 episodes in one runner process, and what start-up
// loads before hello. Neither asserts a speed (machines differ); both print
// what they measured as test diagnostics.

import { test } from "node:test";
import assert from "node:assert/strict";
import { copyFileSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { Runner, completion, episodeStart, reply, startRunner, toolCall, toolReply } from "./frames.test.mjs";

const RUNNER_DIR = fileURLToPath(new URL("..", import.meta.url));

test("500 sequential tiny episodes in one process", async (t) => {
  const root = mkdtempSync(join(tmpdir(), "wmo-runner-soak-"));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  const r = await startRunner(t, { cwd: root, env: { WMO_KEEPALIVE_MS: "5" } });
  const agent = "export async function runEpisode(ctx) { const c = await ctx.llm({}); ctx.submit(c.id); }";
  let rssAt50 = 0;
  let expectedReqId = 1;
  const started = Date.now();
  for (let i = 1; i <= 500; i++) {
    const id = "soak-" + i;
    // a user-harness episode every 50th, builtin otherwise
    const user = i % 50 === 0;
    r.send(episodeStart(id, user ? { files: { "agent.mjs": agent } } : { instruction: "task " + i }));
    const req = await r.next("llm_request");
    assert.equal(req.episode_id, id);
    assert.equal(req.req_id, expectedReqId++);
    if (user) {
      reply(r, req, { ...completion({ content: "x" }), id: "answer-" + i });
    } else if (i % 3 === 0) {
      reply(r, req, completion({ toolCalls: [toolCall("a", "bash", { cmd: "echo " + i })] }));
      const treq = await r.next("tool_request");
      assert.equal(treq.req_id, expectedReqId++);
      toolReply(r, treq, "out " + i);
      const req2 = await r.next("llm_request");
      assert.equal(req2.req_id, expectedReqId++);
      reply(r, req2, completion({ toolCalls: [toolCall("b", "submit", { answer: "answer-" + i })] }));
    } else {
      reply(r, req, completion({ toolCalls: [toolCall("b", "submit", { answer: "answer-" + i })] }));
    }
    const done = await r.next("done");
    assert.equal(done.episode_id, id);
    assert.equal(done.answer, "answer-" + i);
    assert.equal(done.reason, "submit");
    if (i === 50) rssAt50 = r.rssKb();
    // keep the consumed-frame log from growing in the test process
    r.all.length = 0;
  }
  const rssAt500 = r.rssKb();
  const ms = Date.now() - started;
  t.diagnostic(`500 episodes in ${ms} ms; runner VmRSS ${rssAt50} kB after 50, ${rssAt500} kB after 500 (growth ${rssAt500 - rssAt50} kB)`);
  // the one user harness (the same files every 50th episode) is written once, not per episode
  assert.deepEqual(readdirSync(root), [".wmo-harness"], "no per-episode directories");
  assert.equal(readdirSync(join(root, ".wmo-harness")).length, 1, "one harness directory for one file set");
  // generous sanity bound only: a real per-episode leak of the message history would blow far past it
  assert.ok(rssAt500 - rssAt50 < 64 * 1024, `RSS grew by ${rssAt500 - rssAt50} kB`);
  r.send({ type: "shutdown" });
  assert.equal(await r.exitCode(), 0);
  assert.deepEqual(readdirSync(root), [], "nothing left after the runner exits");
});

test("hello comes first and unprompted, and needs no module that is loaded at first use", async (t) => {
  // A runner directory without the harness modules: start-up must not load them.
  const dir = mkdtempSync(join(tmpdir(), "wmo-runner-startup-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const lazy = ["user_harness.mjs", "pi_harness.mjs"];
  for (const name of readdirSync(RUNNER_DIR)) {
    if (name.endsWith(".mjs") && !lazy.includes(name)) copyFileSync(join(RUNNER_DIR, name), join(dir, name));
  }
  const r = await startRunner(t, { script: join(dir, "runner.mjs"), cwd: dir, env: { WMO_PI_BUNDLE: "" } });
  assert.equal(r.all[0].type, "hello", "hello is the first frame, sent before any input");
  // the first user-harness episode is what loads its module
  r.send(episodeStart("u1", { files: { "agent.mjs": "export function runEpisode(ctx) { ctx.submit('x'); }" } }));
  assert.match((await r.next("episode_error")).note, /user_harness\.mjs/);

  // How long hello takes from spawn, for the record (machines differ: no bound).
  const samples = [];
  for (let i = 0; i < 20; i++) {
    const each = new Runner();
    try {
      await each.hello();
      samples.push(Number(each.helloAt - each.spawnedAt) / 1e6);
    } finally {
      await each.close();
    }
  }
  samples.sort((a, b) => a - b);
  const median = (samples[9] + samples[10]) / 2;
  t.diagnostic(`hello latency: median ${median.toFixed(1)} ms, min ${samples[0].toFixed(1)} ms, max ${samples[19].toFixed(1)} ms`);
});
