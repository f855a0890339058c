// The user-harness cache: a harness (episode_start.files holding agent.mjs) is
// materialized once per distinct file set under <cwd>/.wmo-harness/<hash>/ and
// its agent.mjs imported once, so a runner serving many episodes of the same
// harness does not grow (Node never frees an imported ES module).

import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { completion, episodeStart, reply, startRunner } from "./frames.test.mjs";

function tempRoot(t) {
  const root = mkdtempSync(join(tmpdir(), "wmo-harness-cache-"));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  return root;
}

// The harness directories under <root>/.wmo-harness.
function harnessDirs(root) {
  const base = join(root, ".wmo-harness");
  return existsSync(base) ? readdirSync(base).sort() : [];
}

// ~100 KB of module code, imported by agent.mjs, plus a data file read through
// import.meta.url: the harness is a small module graph, as a real one is.
function bigHarness() {
  const lib = Array.from({ length: 1300 }, (_, i) => `export function f${i}(x) { return x + ${i} + "abcdefghijklmnopqrstuvwxyz".length; }\n`).join("");
  assert.ok(lib.length >= 100 * 1024, `lib is ${lib.length} bytes`);
  return {
    "agent.mjs": `
import * as lib from "./lib/big.mjs";
import { readFileSync } from "node:fs";
export async function runEpisode(ctx) {
  const data = readFileSync(new URL("./data/word.txt", import.meta.url), "utf8");
  const c = await ctx.llm({});
  ctx.submit(c.id + ":" + data + ":" + lib.f1299(0));
}`,
    "lib/big.mjs": lib,
    "data/word.txt": "w",
  };
}

test("200 episodes of the same 100 KB harness keep runner RSS flat", async (t) => {
  const root = tempRoot(t);
  const r = await startRunner(t, { cwd: root });
  const files = bigHarness();
  let rssAt20 = 0;
  const started = Date.now();
  for (let i = 1; i <= 200; i++) {
    const id = "big-" + i;
    r.send(episodeStart(id, { files }));
    const req = await r.next("llm_request", { timeout: 15000 });
    assert.equal(req.episode_id, id);
    reply(r, req, { ...completion({ content: "x" }), id: "a" + i });
    const done = await r.next("done", { timeout: 15000 });
    assert.equal(done.episode_id, id);
    assert.equal(done.answer, "a" + i + ":w:" + (1299 + 26));
    if (i === 20) rssAt20 = r.rssKb();
    r.all.length = 0;
  }
  const rssAt200 = r.rssKb();
  const growth = rssAt200 - rssAt20;
  t.diagnostic(
    `200 episodes of a ${files["lib/big.mjs"].length}-byte harness in ${Date.now() - started} ms; runner VmRSS ` +
      `${rssAt20} kB after 20, ${rssAt200} kB after 200 (growth ${growth} kB, ${(growth / 180).toFixed(1)} kB/episode)`
  );
  assert.equal(harnessDirs(root).length, 1, "one harness directory for one file set");
  assert.ok(growth < 16 * 1024, `RSS grew by ${growth} kB between episode 20 and 200`);
  r.send({ type: "shutdown" });
  assert.equal(await r.exitCode(), 0);
  assert.deepEqual(readdirSync(root), [], "nothing left after the runner exits");
});

test("two different harnesses both work in one runner, each materialized once", async (t) => {
  const root = tempRoot(t);
  const r = await startRunner(t, { cwd: root });
  const harness = (name) => ({
    "agent.mjs": `import { tag } from "./tag.mjs"; export async function runEpisode(ctx) { ctx.submit(tag + ":" + ctx.episodeId); }`,
    "tag.mjs": `export const tag = ${JSON.stringify(name)};`,
  });
  const a = harness("A");
  const b = harness("B");
  for (let i = 0; i < 6; i++) {
    const which = i % 2 === 0 ? "A" : "B";
    const id = "two-" + i;
    // the same file set in a different key order is the same harness
    const files = which === "A" ? a : Object.fromEntries(Object.entries(b).reverse());
    r.send(episodeStart(id, { files }));
    const done = await r.next("done");
    assert.deepEqual([done.episode_id, done.reason, done.answer], [id, "submit", which + ":" + id]);
  }
  const dirs = harnessDirs(root);
  assert.equal(dirs.length, 2, `two harness directories: ${dirs}`);
  for (const d of dirs) {
    assert.match(d, /^[0-9a-f]{16}$/);
    assert.ok(existsSync(join(root, ".wmo-harness", d, "agent.mjs")));
  }
  assert.deepEqual(readdirSync(root), [".wmo-harness"], "nothing but the harness cache in the runner's cwd");
  // the builtin harness still runs between them
  r.send(episodeStart("builtin-1"));
  assert.equal((await r.next("llm_request")).episode_id, "builtin-1");
  r.child.stdin.end();
  assert.equal(await r.exitCode(), 0);
  assert.deepEqual(readdirSync(root), [], "nothing left after the runner exits");
});

test("a ctx from an earlier episode cannot act in a later one", async (t) => {
  const root = tempRoot(t);
  const r = await startRunner(t, { cwd: root });
  // module-level state survives between episodes of one harness (the module is
  // imported once); the ctx it keeps does not reach the new episode
  const agent = `
let prev = null;
let count = 0;
export async function runEpisode(ctx) {
  count += 1;
  if (prev === null) { prev = ctx; ctx.submit("first"); return; }
  let err = "none";
  try { await prev.llm({}); } catch (e) { err = e.message; }
  prev.submit("stale submit");
  prev.log("stale log");
  const same = prev === ctx;
  prev = ctx;
  ctx.submit(["count=" + count, "same=" + same, err].join(" "));
}`;
  r.send(episodeStart("s1", { files: { "agent.mjs": agent } }));
  assert.equal((await r.next("done")).answer, "first");
  r.send(episodeStart("s2", { files: { "agent.mjs": agent } }));
  const done = await r.next("done");
  assert.deepEqual([done.episode_id, done.answer], ["s2", "count=2 same=false episode s1 has already ended"]);
  assert.equal(r.all.filter((f) => f.type === "log" || f.type === "llm_request").length, 0, "the stale ctx sent nothing");
});

test("an episode_id that is no directory name is fine: ids no longer name directories", async (t) => {
  const root = tempRoot(t);
  const r = await startRunner(t, { cwd: root });
  const files = { "agent.mjs": "export function runEpisode(ctx) { ctx.submit(ctx.episodeId); }" };
  for (const id of ["a/b", "..", "x".repeat(300)]) {
    r.send(episodeStart(id, { files }));
    const done = await r.next("done");
    assert.deepEqual([done.episode_id, done.answer], [id, id]);
  }
  assert.equal(harnessDirs(root).length, 1);
});

test("a harness directory removed behind the runner's back is written again", async (t) => {
  const root = tempRoot(t);
  const r = await startRunner(t, { cwd: root });
  const files = {
    "agent.mjs": `
import { readFileSync } from "node:fs";
export async function runEpisode(ctx) {
  const m = await import("./later.mjs");
  ctx.submit(m.v + ":" + readFileSync(new URL("./data.txt", import.meta.url), "utf8"));
}`,
    "later.mjs": "export const v = 'lazy';",
    "data.txt": "one",
  };
  r.send(episodeStart("g1", { files }));
  assert.equal((await r.next("done")).answer, "lazy:one");
  rmSync(join(root, ".wmo-harness"), { recursive: true, force: true });
  r.send(episodeStart("g2", { files: { ...files, "data.txt": "two" } }));
  assert.equal((await r.next("done")).answer, "lazy:two");
  r.send(episodeStart("g3", { files }));
  assert.equal((await r.next("done")).answer, "lazy:one");
  await r.stderrMatches(/disappeared; writing it again/);
  assert.equal(harnessDirs(root).length, 2);
  for (const d of harnessDirs(root)) {
    assert.equal(readFileSync(join(root, ".wmo-harness", d, "later.mjs"), "utf8"), files["later.mjs"]);
  }
});

test("more than 16 distinct harnesses keep working, with a note on stderr", async (t) => {
  const root = tempRoot(t);
  const r = await startRunner(t, { cwd: root });
  for (let i = 0; i < 18; i++) {
    r.send(episodeStart("m" + i, { files: { "agent.mjs": `export function runEpisode(ctx) { ctx.submit("h${i}"); }` } }));
    assert.equal((await r.next("done")).answer, "h" + i);
  }
  await r.stderrMatches(/17 distinct user harnesses/);
  assert.equal(harnessDirs(root).length, 18);
  r.send({ type: "shutdown" });
  assert.equal(await r.exitCode(), 0);
  assert.deepEqual(readdirSync(root), []);
});

test("files sent once under a digest are named by it after, and an unknown digest is refused", async (t) => {
  const root = tempRoot(t);
  const r = await startRunner(t, { cwd: root });
  const files = { "agent.mjs": "export function runEpisode(ctx) { ctx.submit('ran ' + ctx.episodeId); }" };
  r.send(episodeStart("s1", { files, files_digest: "sha256:aa" }));
  assert.equal((await r.next("done")).answer, "ran s1");
  // The digest alone: the runner runs the files it kept.
  r.send(episodeStart("s2", { harness: "user", files: {}, files_digest: "sha256:aa" }));
  assert.equal((await r.next("done")).answer, "ran s2");
  // A digest it was never sent: refused, never run as another harness.
  r.send(episodeStart("s3", { harness: "user", files: {}, files_digest: "sha256:bb" }));
  const refused = await r.next("episode_error");
  assert.equal(refused.episode_id, "s3");
  assert.match(refused.note, /sha256:bb were never sent/);
});
