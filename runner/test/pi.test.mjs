// The pi harness (runner/pi_harness.mjs) against the real pi packages, bundled.
//
// The bundle is built once into target/pi-cache (the layout, inputs and marker of
// the host's builder, src/runner/pi/build.rs: `npm ci` of runner/pi/package-lock.json,
// then `node build.mjs`, then node_modules removed), and reused by later runs, the
// Rust tests' too. Set WMO_PI_BUNDLE to an existing bundle to skip the build. If it
// cannot be built (no npm, registry down), these tests fail, saying why; they never
// skip.

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

import { EPISODE_HELLO, FLAT_TOOLS, NUDGE_TAIL, TOOLS, Runner, completion, episodeStart, reply, startRunner, strip, toolCall, toolReply } from "./frames.test.mjs";

const REPO = fileURLToPath(new URL("../../", import.meta.url));
const PACKAGES = ["@mariozechner/pi-agent-core", "@mariozechner/pi-ai"];
const INPUTS = ["package.json", "package-lock.json", "entry.mjs", "build.mjs"];
const BUNDLE = "pi.mjs";
const MARKER = ".wmo-installed";

function pinned(name) {
  const src = readFileSync(join(REPO, "src/runner/pi.rs"), "utf8");
  const m = new RegExp(`pub const ${name}: &str = "([^"]+)";`).exec(src);
  if (!m) throw new Error(`src/runner/pi.rs has no ${name} constant`);
  return m[1];
}

const sha256 = (bytes) => createHash("sha256").update(bytes).digest("hex");

// The marker's lines naming the inputs, as src/runner/pi/build.rs writes them.
function inputsText(version) {
  const specs = [...PACKAGES.map((p) => `${p}@${version}`), `esbuild@${pinned("ESBUILD_VERSION")}`];
  const digests = INPUTS.map((n) => `sha256:${sha256(readFileSync(join(REPO, "runner/pi", n)))} ${n}`);
  return [...specs, ...digests].map((l) => l + "\n").join("");
}

function run(cmd, args, cwd, what) {
  const r = spawnSync(cmd, args, { cwd, encoding: "utf8", timeout: 600_000, env: { ...process.env, npm_config_update_notifier: "false" } });
  if (r.error) throw new Error(`cannot run ${cmd} to ${what} for the pi tests: ${r.error.message}`);
  if (r.status !== 0) {
    throw new Error(`${cmd} ${args.join(" ")} failed (status ${r.status}, signal ${r.signal}) while trying to ${what}; stderr (tail):\n${(r.stderr || "").slice(-3000)}`);
  }
  return r.stdout;
}

// The pi bundle, building it into target/pi-cache first when needed. Throws
// (never skips) when that is impossible.
function ensurePiBundle() {
  const version = pinned("PI_VERSION");
  const override = process.env.WMO_PI_BUNDLE;
  if (override) {
    return { file: override, sha256: sha256(readFileSync(override)), version, builtNow: false };
  }
  const npmDir = join(REPO, "target", "pi-cache", "npm");
  const dir = join(npmDir, `pi-${version}`);
  const inputs = inputsText(version);
  const found = () => {
    try {
      const marker = readFileSync(join(dir, MARKER), "utf8");
      const m = /^sha256:([0-9a-f]{64}) pi\.mjs\n$/.exec(marker.startsWith(inputs) ? marker.slice(inputs.length) : "");
      if (m === null) return null;
      const actual = sha256(readFileSync(join(dir, BUNDLE)));
      if (actual !== m[1]) throw new Error(`${join(dir, BUNDLE)} has sha256 ${actual}, not the ${m[1]} it was built with: remove ${dir}`);
      return { file: join(dir, BUNDLE), sha256: actual, version };
    } catch (e) {
      if (e && e.code === "ENOENT") return null;
      throw e;
    }
  };
  const done = found();
  if (done !== null) return { ...done, builtNow: false };

  mkdirSync(npmDir, { recursive: true });
  const tmp = mkdtempSync(join(npmDir, `.pi-${version}.nodetest.`));
  try {
    for (const n of INPUTS) writeFileSync(join(tmp, n), readFileSync(join(REPO, "runner/pi", n)));
    run("npm", ["ci", "--no-audit", "--no-fund", "--ignore-scripts", "--include=optional"], tmp, "install the pi bundle's inputs (the npm registry, once)");
    const report = run("node", ["build.mjs", BUNDLE], tmp, "bundle pi");
    const versions = JSON.parse(report).versions;
    for (const pkg of PACKAGES) {
      if (versions[pkg] !== version) throw new Error(`the bundle holds ${pkg}@${versions[pkg]}, not ${version}`);
    }
    writeFileSync(join(tmp, "bundle.json"), report);
    rmSync(join(tmp, "node_modules"), { recursive: true, force: true });
    writeFileSync(join(tmp, MARKER), inputs + `sha256:${sha256(readFileSync(join(tmp, BUNDLE)))} ${BUNDLE}\n`);
    try {
      renameSync(tmp, dir);
    } catch (e) {
      if (found() === null) {
        // an incomplete directory in the way: replace it
        rmSync(dir, { recursive: true, force: true });
        renameSync(tmp, dir);
      }
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  const built = found();
  if (built === null) throw new Error(`the pi bundle in ${dir} is incomplete after building`);
  return { ...built, builtNow: true };
}

let piPromise = null;
function pi() {
  if (piPromise === null) {
    piPromise = Promise.resolve().then(() => {
      const t0 = Date.now();
      const found = ensurePiBundle();
      found.buildMs = Date.now() - t0;
      return found;
    });
  }
  return piPromise;
}

const bundleEnv = (b) => ({ WMO_PI_BUNDLE: b.file, WMO_PI_BUNDLE_SHA256: b.sha256 });

async function startPiRunner(t, env = {}) {
  const bundle = await pi();
  return startRunner(t, { env: { ...bundleEnv(bundle), ...env } });
}

// A stand-in bundle (banner naming `version`, then `body`), written to a fresh
// directory: its path and digest.
function fakeBundle(t, body, version = "9.9.9") {
  const dir = mkdtempSync(join(tmpdir(), "wmo-pi-fake-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const file = join(dir, BUNDLE);
  writeFileSync(file, `// wmo-e2b pi bundle: @mariozechner/pi-agent-core@${version} @mariozechner/pi-ai@${version}\n${body}\n`);
  return { file, sha256: sha256(readFileSync(file)), dir };
}

function piStart(id, overrides = {}) {
  return episodeStart(id, { harness: "pi", ...overrides });
}

function submitCall(id, answer) {
  return toolCall(id, "submit", { answer });
}

function lastMessage(req) {
  const msgs = req.openai_body.messages;
  return msgs[msgs.length - 1];
}

function median(v) {
  const s = [...v].sort((a, b) => a - b);
  const n = s.length;
  return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

const ms = (a, b) => Number(b - a) / 1e6;

// ---------------------------------------------------------------------------

test("the pinned pi packages are bundled (or WMO_PI_BUNDLE names a bundle)", async (t) => {
  const found = await pi();
  t.diagnostic(`pi ${found.version} bundle ${found.file} sha256 ${found.sha256} (${found.builtNow ? `built now in ${found.buildMs} ms` : "cached"})`);
  const first = readFileSync(found.file, "utf8").split("\n", 1)[0];
  for (const pkg of PACKAGES) assert.ok(first.includes(`${pkg}@${found.version}`), first);
});

test("the bundle is one module: only Node builtins outside it, exactly the harness's exports", async (t) => {
  const { file } = await pi();
  const text = readFileSync(file, "utf8");
  // every static import and every literal dynamic import names a builtin
  const specifiers = [...text.matchAll(/^\s*(?:import|export)\b[^;]*?\bfrom\s*["']([^"']+)["']/gm), ...text.matchAll(/\bimport\(\s*["']([^"']+)["']\s*\)/g)].map((m) => m[1]);
  assert.deepEqual(specifiers.filter((s) => !s.startsWith("node:")), [], "imports outside the bundle");
  assert.doesNotMatch(text, /from\s*["']@mariozechner\//);
  const mod = await import(pathToFileURL(file).href);
  assert.deepEqual(Object.keys(mod).sort(), ["createAssistantMessageEventStream", "runAgentLoop"]);
});

test("pi-ai's providers are stubs in the bundle: only the harness's streamFn can answer a model call", async (t) => {
  const { file } = await pi();
  const { runAgentLoop } = await import(pathToFileURL(file).href);
  const model = { id: "m", name: "m", api: "openai-completions", provider: "openai", baseUrl: "http://127.0.0.1:9/v1", reasoning: false, input: ["text"], cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }, contextWindow: 1000, maxTokens: 10 };
  const prompt = { role: "user", content: "hi", timestamp: Date.now() };
  // no streamFn: pi falls back to its registered provider, which is not bundled
  const produced = await runAgentLoop([prompt], { systemPrompt: "", messages: [], tools: [] }, { model, apiKey: "k", getApiKey: () => "k", convertToLlm: (m) => m }, () => {});
  const last = produced[produced.length - 1];
  assert.equal(last.stopReason, "error");
  assert.match(last.errorMessage, /provider module \.\/openai-completions\.js is not in the wmo-e2b pi bundle/);
});

test("hello reports pi_version, the bundle's digest and the harnesses", async (t) => {
  const { version, sha256: digest } = await pi();
  const r = await startPiRunner(t);
  assert.deepEqual(strip(r.all[0]), { ...EPISODE_HELLO, harnesses: ["builtin", "pi"], pi_version: version, pi_bundle_sha256: digest });
});

test("a bundle whose digest is not the host's is refused before hello, naming the file", async (t) => {
  const real = await pi();
  // truncated: what a torn copy looks like
  const torn = fakeBundle(t, "");
  writeFileSync(torn.file, readFileSync(real.file).subarray(0, 5000));
  const r = await startRunner(t, { env: { WMO_PI_BUNDLE: torn.file, WMO_PI_BUNDLE_SHA256: real.sha256 } });
  const hello = r.all[0];
  assert.deepEqual(hello.harnesses, ["builtin"]);
  assert.equal(hello.pi_version, undefined);
  assert.equal(hello.pi_bundle_sha256, sha256(readFileSync(torn.file)));
  assert.ok(hello.pi_error.includes(torn.file), hello.pi_error);
  assert.match(hello.pi_error, new RegExp(`has sha256 ${hello.pi_bundle_sha256}, not ${real.sha256}`));
  r.send(piStart("x1"));
  assert.match((await r.next("episode_error")).note, /the pi harness cannot run here: the pi bundle/);
});

test("pi is not imported before hello: a bundle without pi's exports still says hello, then the pi episode fails clearly", async (t) => {
  const fake = fakeBundle(t, "export const nothing = 1;");
  const r = await startRunner(t, { env: bundleEnv(fake) });
  assert.equal(r.all[0].pi_version, "9.9.9");
  r.send(piStart("f1"));
  const err = await r.next("episode_error");
  assert.equal(err.episode_id, "f1");
  assert.match(err.note, /the pi bundle .*pi\.mjs has no runAgentLoop export/);
  // the builtin harness still works in that runner
  r.send(episodeStart("f2"));
  const req = await r.next("llm_request");
  reply(r, req, completion({ toolCalls: [submitCall("s", "ok")] }));
  assert.equal((await r.next("done")).answer, "ok");
});

test("pi is imported at its first episode: hello and a builtin episode never wait for it", async (t) => {
  // A stand-in bundle that records, in the file WMO_TEST_PI_MARKER names, that it was
  // imported. Its agent loop runs no turn.
  const fake = fakeBundle(
    t,
    'import { appendFileSync } from "node:fs";\nappendFileSync(process.env.WMO_TEST_PI_MARKER, "imported\\n");\n' +
      "export async function runAgentLoop() { return []; }\nexport function createAssistantMessageEventStream() { return { push() {} }; }"
  );
  const marker = join(fake.dir, "imported");
  const r = await startRunner(t, { env: { ...bundleEnv(fake), WMO_TEST_PI_MARKER: marker } });
  assert.equal(r.all[0].pi_version, "9.9.9");
  r.send(episodeStart("b1"));
  reply(r, await r.next("llm_request"), completion({ toolCalls: [submitCall("s", "ok")] }));
  assert.equal((await r.next("done")).answer, "ok");
  assert.equal(existsSync(marker), false, "pi was imported before its first episode");
  r.send(piStart("p1"));
  assert.deepEqual(strip(await r.next("done")), { type: "done", episode_id: "p1", reason: "no_tool_call", answer: "", turns: 0 });
  r.send(piStart("p2"));
  await r.next("done");
  assert.equal(readFileSync(marker, "utf8"), "imported\n", "imported once");
});

test("WMO_PI_BUNDLE naming nothing, or not a bundle: hello says why, a pi episode is refused", async (t) => {
  const r = await startRunner(t, { env: { WMO_PI_BUNDLE: "/nonexistent/wmo-pi/pi.mjs" } });
  const hello = r.all[0];
  assert.deepEqual(hello.harnesses, ["builtin"]);
  assert.equal(hello.pi_version, undefined);
  assert.match(hello.pi_error, /cannot read the pi bundle \/nonexistent\/wmo-pi\/pi\.mjs: ENOENT/);
  r.send(piStart("n1"));
  const err = await r.next("episode_error");
  assert.match(err.note, /the pi harness cannot run here/);

  const fake = fakeBundle(t, "");
  writeFileSync(fake.file, "export {};\n");
  const r2 = await startRunner(t, { env: { WMO_PI_BUNDLE: fake.file } });
  assert.match(r2.all[0].pi_error, /is not a wmo-e2b pi bundle/);
});

test("without WMO_PI_BUNDLE a pi episode is an episode_error; an unknown harness too", async (t) => {
  const r = await startRunner(t, { env: { WMO_PI_BUNDLE: "" } });
  assert.equal(r.all[0].harnesses, undefined);
  r.send(piStart("d1"));
  assert.match((await r.next("episode_error")).note, /pi harness is not enabled/);
  r.send(episodeStart("d2", { harness: "mystery" }));
  assert.match((await r.next("episode_error")).note, /unknown harness "mystery"/);
  // "builtin" and "user" are the other known names
  r.send(episodeStart("d3", { harness: "builtin" }));
  const req = await r.next("llm_request");
  reply(r, req, completion({ toolCalls: [submitCall("s", "b")] }));
  assert.equal((await r.next("done")).reason, "submit");
});

test("a full pi episode: bash tool_request, tool_response, submit", async (t) => {
  const r = await startPiRunner(t);
  r.send(piStart("e1", { instruction: "list the files", system: "sys prompt", max_output_tokens: 321, temperature: 0.5 }));
  const req1 = await r.next("llm_request", { timeout: 20000 });
  assert.equal(req1.episode_id, "e1");
  const body1 = req1.openai_body;
  assert.deepEqual(body1.messages, [
    { role: "system", content: "sys prompt" },
    { role: "user", content: "list the files" },
  ]);
  assert.deepEqual(body1.tools, TOOLS, "the host's tool definitions go to the model unchanged");
  assert.equal(body1.max_tokens, 321);
  assert.equal(body1.temperature, 0.5);
  assert.equal(body1.stream, undefined);

  reply(r, req1, completion({ content: "looking", toolCalls: [toolCall("c1", "bash", { cmd: "ls -la" })] }));
  const treq = await r.next("tool_request");
  assert.equal(treq.episode_id, "e1");
  assert.equal(treq.name, "bash");
  assert.deepEqual(treq.arguments, { cmd: "ls -la" });
  toolReply(r, treq, "a.txt\nb.txt");

  const req2 = await r.next("llm_request");
  assert.deepEqual(req2.openai_body.messages.slice(2), [
    { role: "assistant", content: "looking", tool_calls: [toolCall("c1", "bash", { cmd: "ls -la" })] },
    { role: "tool", tool_call_id: "c1", content: "a.txt\nb.txt" },
  ]);
  reply(r, req2, completion({ toolCalls: [submitCall("c2", "two files")] }));
  const done = await r.next("done");
  assert.deepEqual(strip(done), { type: "done", episode_id: "e1", reason: "submit", answer: "two files", turns: 2 });
  assert.deepEqual(done.skipped, []);
});

test("flat tool specs (the reference's shape) become pi tools; an unknown shape is refused", async (t) => {
  const r = await startPiRunner(t);
  r.send(piStart("f1", { tools: FLAT_TOOLS }));
  const req1 = await r.next("llm_request", { timeout: 20000 });
  assert.deepEqual(req1.openai_body.tools, TOOLS, "the model sees every tool, in OpenAI's shape");
  reply(r, req1, completion({ toolCalls: [toolCall("c1", "bash", { cmd: "ls" })] }));
  const treq = await r.next("tool_request");
  assert.equal(treq.name, "bash");
  assert.deepEqual(treq.arguments, { cmd: "ls" });
  toolReply(r, treq, "a.txt");
  reply(r, await r.next("llm_request"), completion({ toolCalls: [submitCall("s", "ok")] }));
  const done = await r.next("done");
  assert.deepEqual([done.reason, done.answer], ["submit", "ok"]);
  r.send(piStart("f2", { tools: [FLAT_TOOLS[0], { description: "no name" }] }));
  const err = await r.next("episode_error");
  assert.equal(err.episode_id, "f2");
  assert.match(err.note, /tool spec 1 has an unknown shape \(it has no name\)/);
});

test("a tool error reaches the model as the tool result; a second episode starts clean", async (t) => {
  const r = await startPiRunner(t);
  r.send(piStart("t1"));
  const req = await r.next("llm_request", { timeout: 20000 });
  reply(r, req, completion({ toolCalls: [toolCall("c1", "bash", { cmd: "false" })] }));
  const treq = await r.next("tool_request");
  toolReply(r, treq, "exit 1: boom", true);
  const req2 = await r.next("llm_request");
  assert.deepEqual(lastMessage(req2), { role: "tool", tool_call_id: "c1", content: "exit 1: boom" });
  reply(r, req2, completion({ toolCalls: [submitCall("c2", "x")] }));
  assert.equal((await r.next("done")).reason, "submit");

  r.send(piStart("t2", { instruction: "second" }));
  const req3 = await r.next("llm_request");
  assert.deepEqual(req3.openai_body.messages.map((m) => m.role), ["system", "user"]);
  assert.equal(req3.openai_body.messages[1].content, "second");
  reply(r, req3, completion({ toolCalls: [submitCall("c1", "y")] }));
  assert.equal((await r.next("done")).answer, "y");
});

test("several tool calls run in order, one tool_request at a time; submit in the batch ends the episode", async (t) => {
  const r = await startPiRunner(t);
  r.send(piStart("b1"));
  const req = await r.next("llm_request", { timeout: 20000 });
  reply(
    r,
    req,
    completion({
      toolCalls: [toolCall("a", "bash", { cmd: "one" }), toolCall("b", "bash", { cmd: "two" }), submitCall("c", "fin"), toolCall("d", "bash", { cmd: "never" })],
    })
  );
  const t1 = await r.next("tool_request");
  assert.deepEqual(t1.arguments, { cmd: "one" });
  // nothing else is outstanding until this one is answered
  await new Promise((res) => setTimeout(res, 50));
  assert.deepEqual(r.queue.filter((f) => f.type !== "transport_keepalive"), []);
  toolReply(r, t1, "1");
  const t2 = await r.next("tool_request");
  assert.deepEqual(t2.arguments, { cmd: "two" });
  toolReply(r, t2, "2");
  const done = await r.next("done");
  assert.deepEqual(strip(done), { type: "done", episode_id: "b1", reason: "submit", answer: "fin", turns: 1 });
});

test("turn cap: max_turns llm calls, then done max_turns", async (t) => {
  const r = await startPiRunner(t);
  r.send(piStart("m1", { max_turns: 3 }));
  for (let i = 1; i <= 3; i++) {
    const req = await r.next("llm_request", { timeout: 20000 });
    reply(r, req, completion({ content: "step " + i, toolCalls: [toolCall("c" + i, "bash", { cmd: "echo " + i })] }));
    const treq = await r.next("tool_request");
    assert.deepEqual(treq.arguments, { cmd: "echo " + i });
    toolReply(r, treq, "out " + i);
  }
  const done = await r.next("done");
  assert.deepEqual(strip(done), { type: "done", episode_id: "m1", reason: "max_turns", answer: "step 3", turns: 3 });
});

test("a provider error ends the episode with provider_error", async (t) => {
  const r = await startPiRunner(t);
  r.send(piStart("p1"));
  const req = await r.next("llm_request", { timeout: 20000 });
  reply(r, req, completion({ content: "thinking", toolCalls: [toolCall("c1", "bash", { cmd: "ls" })] }));
  toolReply(r, await r.next("tool_request"), "ok");
  const req2 = await r.next("llm_request");
  r.send({ type: "llm_response", episode_id: "p1", req_id: req2.req_id, error: "upstream 500 after 3 retries" });
  const done = await r.next("done");
  assert.deepEqual(strip(done), { type: "done", episode_id: "p1", reason: "provider_error", answer: "thinking", turns: 2 });
  // a completion without choices is a provider error too
  r.send(piStart("p2"));
  const req3 = await r.next("llm_request");
  reply(r, req3, { id: "x", choices: [] });
  assert.equal((await r.next("done")).reason, "provider_error");
});

test("text-only replies are nudged, then the episode ends no_tool_call", async (t) => {
  const r = await startPiRunner(t);
  r.send(piStart("n1"));
  const req1 = await r.next("llm_request", { timeout: 20000 });
  reply(r, req1, completion({ content: "I think it is 4." }));
  const req2 = await r.next("llm_request");
  assert.deepEqual(req2.openai_body.messages.slice(2), [
    { role: "assistant", content: "I think it is 4." },
    { role: "user", content: "[ERROR] Your reply contained no tool call. " + NUDGE_TAIL },
  ]);
  reply(r, req2, completion({ content: "Still 4." }));
  const req3 = await r.next("llm_request");
  assert.equal(lastMessage(req3).content, "[ERROR] Your reply contained no tool call. " + NUDGE_TAIL);
  reply(r, req3, completion({ content: "  Final: 4  " }));
  const done = await r.next("done");
  assert.deepEqual(strip(done), { type: "done", episode_id: "n1", reason: "no_tool_call", answer: "Final: 4", turns: 3 });
});

test("a tool call resets the nudge count; a text reply at the turn cap ends no_tool_call", async (t) => {
  const r = await startPiRunner(t);
  r.send(piStart("n2", { max_turns: 4 }));
  let req = await r.next("llm_request", { timeout: 20000 });
  reply(r, req, completion({ content: "a" }));
  req = await r.next("llm_request");
  reply(r, req, completion({ content: "b" }));
  req = await r.next("llm_request");
  reply(r, req, completion({ toolCalls: [toolCall("c", "bash", { cmd: "x" })] }));
  toolReply(r, await r.next("tool_request"), "x");
  req = await r.next("llm_request");
  assert.equal(lastMessage(req).role, "tool", "no nudge after a tool turn");
  reply(r, req, completion({ content: "d" }));
  const done = await r.next("done");
  assert.deepEqual(strip(done), { type: "done", episode_id: "n2", reason: "no_tool_call", answer: "d", turns: 4 });
});

test("a truncated reply's tool calls are not run: output_truncated nudges", async (t) => {
  const r = await startPiRunner(t);
  r.send(piStart("tr1", { max_turns: 2, max_output_tokens: 100 }));
  const req1 = await r.next("llm_request", { timeout: 20000 });
  reply(r, req1, completion({ content: "part", toolCalls: [toolCall("c1", "write_file", '{"path":"a","cont')], finish: "length" }));
  const req2 = await r.next("llm_request");
  assert.deepEqual(req2.openai_body.messages.slice(2), [
    { role: "assistant", content: "part" },
    {
      role: "user",
      content:
        "[ERROR] None of the requested actions ran because the reply exceeded 100 output tokens. " +
        "Re-issue the work in chunks well under that limit. " +
        NUDGE_TAIL,
    },
  ]);
  reply(r, req2, completion({ content: "again", finish: "length" }));
  const done = await r.next("done");
  assert.deepEqual(strip(done), { type: "done", episode_id: "tr1", reason: "output_truncated", answer: "again", turns: 2 });
  assert.deepEqual(done.skipped, []);
});

test("unparsed tool-call warnings nudge and classify as unparsed_tool_call", async (t) => {
  const r = await startPiRunner(t);
  r.send(piStart("u1", { max_turns: 1 }));
  const req = await r.next("llm_request", { timeout: 20000 });
  reply(r, req, completion({ content: "<tool_call>bash", extra: { wmo_unparsed_tool_calls: ["unclosed <tool_call>"] } }));
  const done = await r.next("done");
  assert.equal(done.reason, "unparsed_tool_call");
  assert.equal(done.turns, 1);
});

test("bad tool arguments never reach the host: invalid JSON, schema violations, unknown tools", async (t) => {
  const r = await startPiRunner(t);
  r.send(piStart("a1"));
  const req1 = await r.next("llm_request", { timeout: 20000 });
  reply(
    r,
    req1,
    completion({
      toolCalls: [toolCall("x1", "bash", "{not json"), toolCall("x2", "bash", { command: "ls" }), toolCall("x3", "nope", {})],
    })
  );
  const req2 = await r.next("llm_request");
  assert.deepEqual(req2.skipped, [], "no tool_request was sent");
  const msgs = req2.openai_body.messages;
  assert.deepEqual(msgs[2].tool_calls.map((c) => c.function.arguments), ["{not json", '{"command":"ls"}', "{}"]);
  const results = msgs.slice(3);
  assert.deepEqual(results.map((m) => [m.role, m.tool_call_id]), [["tool", "x1"], ["tool", "x2"], ["tool", "x3"]]);
  assert.match(results[0].content, /could not parse the arguments of bash as JSON/);
  assert.match(results[1].content, /Validation failed for tool "bash"/);
  assert.match(results[2].content, /Tool nope not found/);
  reply(r, req2, completion({ toolCalls: [submitCall("s", "ok")] }));
  assert.equal((await r.next("done")).reason, "submit");
});

test("a host without a submit tool still gets one; usage and ids are accepted", async (t) => {
  const r = await startPiRunner(t);
  r.send(piStart("s1", { tools: [TOOLS[0]] }));
  const req = await r.next("llm_request", { timeout: 20000 });
  assert.deepEqual(req.openai_body.tools.map((d) => d.function.name), ["bash", "submit"]);
  const c = completion({ toolCalls: [submitCall("s", { nested: 1 })] });
  c.usage = { prompt_tokens: 100, completion_tokens: 7, total_tokens: 107, prompt_tokens_details: { cached_tokens: 40 } };
  reply(r, req, c);
  // {nested:1} is not a string: pi's validation rejects it and tells the model
  const req2 = await r.next("llm_request");
  assert.match(lastMessage(req2).content, /Validation failed for tool "submit"/);
  reply(r, req2, completion({ toolCalls: [submitCall("s2", "fine")] }));
  assert.equal((await r.next("done")).answer, "fine");
});

// ---------------------------------------------------------------------------
// Measurements, printed as diagnostics. Nothing here asserts a speed (machines
// differ); that pi stays unloaded until its first episode is asserted above.

test("timings: spawn-to-hello, first pi episode, warm per-episode overhead", async (t) => {
  const bundle = await pi();
  const hello = { builtin: [], pi: [] };
  for (let i = 0; i < 10; i++) {
    for (const kind of ["builtin", "pi"]) {
      const r = new Runner({ env: kind === "pi" ? bundleEnv(bundle) : { WMO_PI_BUNDLE: "" } });
      try {
        await r.hello();
        hello[kind].push(ms(r.spawnedAt, r.helloAt));
      } finally {
        await r.close();
      }
    }
  }
  const r = new Runner({ env: bundleEnv(bundle) });
  t.after(() => r.close());
  await r.hello();
  // one episode: episode_start -> llm_request (imports pi the first time) -> submit -> done
  const one = async (id, harness) => {
    const t0 = process.hrtime.bigint();
    r.send(episodeStart(id, { harness }));
    const req = await r.next("llm_request", { timeout: 20000 });
    const t1 = process.hrtime.bigint();
    reply(r, req, completion({ toolCalls: [toolCall("a", "bash", { cmd: "x" })] }));
    const treq = await r.next("tool_request");
    const t2 = process.hrtime.bigint();
    toolReply(r, treq, "y");
    const req2 = await r.next("llm_request");
    const t3 = process.hrtime.bigint();
    reply(r, req2, completion({ toolCalls: [submitCall("s", id)] }));
    const done = await r.next("done");
    const t4 = process.hrtime.bigint();
    assert.equal(done.answer, id);
    r.all.length = 0;
    return { total: ms(t0, t4), first: ms(t0, t1), toTool: ms(t1, t2), toLlm: ms(t2, t3), toDone: ms(t3, t4) };
  };
  const first = await one("first", "pi");
  const warm = { pi: [], builtin: [] };
  for (let i = 0; i < 40; i++) {
    warm.pi.push(await one("wp" + i, "pi"));
    warm.builtin.push(await one("wb" + i, "builtin"));
  }
  const med = (list, k) => median(list.map((x) => x[k])).toFixed(2);
  t.diagnostic(
    `spawn-to-hello median of 10: builtin ${median(hello.builtin).toFixed(1)} ms, pi enabled ${median(hello.pi).toFixed(1)} ms`
  );
  t.diagnostic(`first pi episode (imports pi): episode_start->llm_request ${first.first.toFixed(1)} ms, whole episode ${first.total.toFixed(1)} ms`);
  for (const kind of ["pi", "builtin"]) {
    t.diagnostic(
      `warm ${kind} (median of 40, 2 llm + 1 tool): episode ${med(warm[kind], "total")} ms; start->llm ${med(warm[kind], "first")}, ` +
        `llm_response->tool_request ${med(warm[kind], "toTool")}, tool_response->llm_request ${med(warm[kind], "toLlm")}, llm_response->done ${med(warm[kind], "toDone")} ms`
    );
  }
});

test("500 pi episodes in one runner: RSS stays flat", async (t) => {
  const r = await startPiRunner(t, { WMO_KEEPALIVE_MS: "5" });
  const samples = [];
  const t0 = Date.now();
  for (let i = 1; i <= 500; i++) {
    const id = "soak-" + i;
    r.send(piStart(id, { instruction: "task " + i }));
    const req = await r.next("llm_request", { timeout: 20000 });
    if (i % 3 === 0) {
      reply(r, req, completion({ content: "working on " + i, toolCalls: [toolCall("a", "bash", { cmd: "echo " + i })] }));
      const treq = await r.next("tool_request");
      toolReply(r, treq, "out ".repeat(200) + i);
      const req2 = await r.next("llm_request");
      reply(r, req2, completion({ toolCalls: [submitCall("b", "answer-" + i)] }));
    } else if (i % 7 === 0) {
      reply(r, req, completion({ content: "prose" }));
      const req2 = await r.next("llm_request");
      reply(r, req2, completion({ toolCalls: [submitCall("b", "answer-" + i)] }));
    } else {
      reply(r, req, completion({ toolCalls: [submitCall("b", "answer-" + i)] }));
    }
    const done = await r.next("done");
    assert.equal(done.episode_id, id);
    assert.equal(done.answer, "answer-" + i);
    if (i % 50 === 0) samples.push(r.rssKb());
    r.all.length = 0;
  }
  const elapsed = Date.now() - t0;
  const growth = samples[samples.length - 1] - samples[1];
  t.diagnostic(`500 pi episodes in ${elapsed} ms (${(elapsed / 500).toFixed(2)} ms each); VmRSS kB every 50: ${samples.join(" ")}; growth 100->500: ${growth} kB`);
  assert.ok(growth < 32 * 1024, `RSS grew by ${growth} kB`);
  r.send({ type: "shutdown" });
  assert.equal(await r.exitCode(), 0);
});
