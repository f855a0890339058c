// wmo-e2b in-sandbox runner.
//
// Started as `node runner.mjs` with stdin/stdout pipes. Frames travel one per
// line in both directions: standard base64 (with padding) of the UTF-8 JSON
// text of one object, then "\n". stdout carries frames only; everything else
// goes to stderr.
//
// Deliberately dependency-free and without static imports: the Node version
// check below must be able to run on old Node releases, and start-up has to
// stay fast. `node:` builtins needed by the user-harness path are imported
// lazily.
//
// Harnesses, chosen by episode_start.harness: "builtin" (or absent, with no
// files) runs the loop below; files holding agent.mjs run a user harness; "pi"
// runs the real pi agent loop from pi_harness.mjs (next to this file), enabled
// when WMO_PI_MODULES names a node_modules directory holding the pi packages.
// pi is imported at the first pi episode, never before hello. An
// episode_start naming a harness this runner cannot run, or carrying files or
// tool specs it cannot use, ends in episode_error, never in another harness.
//
// A user harness is content-addressed: each distinct file set is written once
// to <cwd>/.wmo-harness/<hash>/ and its agent.mjs imported once, then reused by
// every episode carrying the same files (Node never frees an imported ES
// module, so importing it afresh per episode would leak its whole module graph
// every episode). .wmo-harness is removed when the runner exits.

// ---------------------------------------------------------------------------
// stdout hygiene: keep the real stdout writer for frames, send everything
// else (console.*, stray process.stdout.write calls) to stderr.

var stdout = process.stdout;
var stderr = process.stderr;
var writeFrameLine = stdout.write.bind(stdout);

function toStderr() {
  var parts = [];
  for (var i = 0; i < arguments.length; i++) {
    var a = arguments[i];
    if (typeof a === "string") parts.push(a);
    else if (a instanceof Error) parts.push(a.stack || String(a));
    else {
      try {
        parts.push(JSON.stringify(a));
      } catch (e) {
        parts.push(String(a));
      }
    }
  }
  stderr.write(parts.join(" ") + "\n");
}

console.log = toStderr;
console.info = toStderr;
console.warn = toStderr;
console.debug = toStderr;
stdout.write = function () {
  return stderr.write.apply(stderr, arguments);
};

function diag(message) {
  try {
    stderr.write("wmo-e2b runner: " + message + "\n");
  } catch (e) {
    // stderr is gone; nothing useful left to do
  }
}

// ---------------------------------------------------------------------------
// Constants

var PROTOCOL = 1;
var RUNNER_VERSION = "0.1.0";
var MAX_NONACTION_TURNS = 3;
var DEFAULT_MAX_TURNS = 20;
var DEFAULT_MAX_OUTPUT_TOKENS = 4096;
var KEEPALIVE_MS = (function () {
  var raw = process.env.WMO_KEEPALIVE_MS;
  var n = raw === undefined ? NaN : Number(raw);
  return Number.isFinite(n) && n > 0 ? Math.floor(n) : 30000;
})();
var NUDGE_TAIL =
  "Continue the task: either call exactly one tool now, or call `submit` with your " +
  "final answer if the task is already complete. Do not reply with prose alone.";
var REPLY_KIND = { llm_request: "llm_response", tool_request: "tool_response" };
// The node_modules directory holding the pi packages, when the host enabled
// the pi harness. Nothing of pi is loaded before the first pi episode.
var PI_MODULES = typeof process.env.WMO_PI_MODULES === "string" && process.env.WMO_PI_MODULES !== "" ? process.env.WMO_PI_MODULES : null;
var PI_MIN_NODE_MAJOR = 20;

// ---------------------------------------------------------------------------
// Process-wide state. Per-episode state lives on the episode object, which is
// dropped when the episode ends.

var nextReqId = 1;
var pending = new Map(); // req_id -> {kind, episode, resolve, reject}
var current = null; // the running episode, if any
var startCwd = process.cwd();
var lazyMods = null;
// User harnesses: sha256 hex of the file set -> {dir, url, loading}; `loading`
// is the promise of the imported agent.mjs namespace, null until imported (or
// after a failed import, so the next episode tries again).
var harnesses = new Map();
var harnessDirNames = new Map(); // directory name under .wmo-harness -> sha256 hex
var harnessRoot = null; // <cwd>/.wmo-harness once this runner has created it
var HARNESS_ROOT_NAME = ".wmo-harness";
var HARNESS_HASH_CHARS = 16; // of the sha256 hex, for the directory name
// Past this many distinct harnesses the runner keeps going, but says on stderr
// that each new one stays in memory (and on disk) for the runner's lifetime.
var HARNESS_SOFT_CAP = 16;
var piUnavailable = null; // why the pi harness cannot run here, if it cannot
var piLoading = null; // promise of the loaded pi_harness.mjs module

// ---------------------------------------------------------------------------
// Output

function send(frame) {
  var json = JSON.stringify(frame);
  writeFrameLine(Buffer.from(json, "utf8").toString("base64") + "\n");
}

// ---------------------------------------------------------------------------
// Input: manual line buffer (lines may be many MB).

var partial = [];

function onData(chunk) {
  var start = 0;
  var nl;
  while ((nl = chunk.indexOf(10, start)) !== -1) {
    var line;
    if (partial.length > 0) {
      partial.push(chunk.subarray(start, nl));
      line = Buffer.concat(partial);
      partial = [];
    } else {
      line = chunk.subarray(start, nl);
    }
    start = nl + 1;
    handleLine(line);
  }
  if (start === 0) {
    partial.push(chunk);
  } else if (start < chunk.length) {
    // copy so a small tail does not pin the whole read chunk
    partial.push(Buffer.from(chunk.subarray(start)));
  }
}

function decodeLine(line) {
  var text = line.toString("latin1").trim();
  if (text === "") return null;
  var json = Buffer.from(text, "base64").toString("utf8");
  var value;
  try {
    value = JSON.parse(json);
  } catch (e) {
    diag("dropped an inbound line that is not base64 JSON (" + text.length + " chars): " + e.message);
    return null;
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    diag("dropped an inbound frame that is not a JSON object");
    return null;
  }
  if (typeof value.type !== "string") {
    diag("dropped an inbound frame without a string type");
    return null;
  }
  return value;
}

function handleLine(line) {
  var frame;
  try {
    frame = decodeLine(line);
  } catch (e) {
    diag("dropped an undecodable inbound line: " + String(e));
    return;
  }
  if (frame === null) return;
  try {
    dispatch(frame);
  } catch (e) {
    diag("error while handling a " + frame.type + " frame: " + (e && e.stack ? e.stack : String(e)));
  }
}

function dispatch(frame) {
  switch (frame.type) {
    case "llm_response":
    case "tool_response":
      resolveReply(frame);
      return;
    case "episode_start":
      onEpisodeStart(frame);
      return;
    case "shutdown":
      exitNow(0);
      return;
    default:
      // unknown frame types are ignored
      return;
  }
}

function resolveReply(frame) {
  var id = frame.req_id;
  var entry = typeof id === "number" ? pending.get(id) : undefined;
  if (entry === undefined) {
    diag("ignored " + frame.type + " for req_id " + JSON.stringify(id) + ": no pending request has that id");
    return;
  }
  if (entry.kind !== frame.type) {
    diag("ignored " + frame.type + " for req_id " + id + ": that request awaits a " + entry.kind);
    return;
  }
  if (typeof frame.episode_id === "string" && frame.episode_id !== entry.episode.id) {
    diag(
      "ignored " + frame.type + " for req_id " + id + ": it names episode " + frame.episode_id +
        " but the request belongs to " + entry.episode.id
    );
    return;
  }
  pending.delete(id);
  entry.resolve(frame);
}

// Sends a request frame for `episode` and returns a promise of the reply frame.
function request(episode, type, fields) {
  if (episode.ended) {
    return Promise.reject(new Error("episode " + episode.id + " has already ended"));
  }
  var reqId = nextReqId++;
  var frame = { type: type, req_id: reqId, episode_id: episode.id };
  for (var k in fields) frame[k] = fields[k];
  return new Promise(function (resolve, reject) {
    pending.set(reqId, { kind: REPLY_KIND[type], episode: episode, resolve: resolve, reject: reject });
    try {
      send(frame);
    } catch (e) {
      pending.delete(reqId);
      reject(e);
    }
  });
}

// ---------------------------------------------------------------------------
// Episodes

function intAtLeast(value, min, fallback) {
  return typeof value === "number" && Number.isInteger(value) && value >= min ? value : fallback;
}

function isPlainObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function preview(value) {
  var text;
  try {
    text = JSON.stringify(value);
  } catch (e) {
    text = String(value);
  }
  text = String(text);
  return text.length > 120 ? text.slice(0, 120) + "..." : text;
}

// Tool specs arrive in two shapes: the reference runtime's flat
// {name, description, parameters}, and OpenAI's {type: "function", function:
// {...}}. Both become OpenAI's, the shape a chat-completions body needs (a
// flat spec also carrying type "function", as OpenAI's Responses API writes
// it, is flat too). Anything else throws, naming the spec.
function normalizeTools(list) {
  if (list === undefined || list === null) return [];
  if (!Array.isArray(list)) throw new Error("tools is not a list of tool specs: " + preview(list));
  var out = [];
  for (var i = 0; i < list.length; i++) {
    var spec = list[i];
    var why = null;
    var fn = null;
    if (!isPlainObject(spec)) why = "it is not an object";
    else if (spec.type !== undefined && spec.type !== "function") why = "its type is " + preview(spec.type) + ", not \"function\"";
    else if (spec.function !== undefined) {
      if (isPlainObject(spec.function)) fn = spec.function;
      else why = "its function is not an object";
    } else {
      fn = {};
      for (var k in spec) if (k !== "type") fn[k] = spec[k];
    }
    if (why === null) {
      if (typeof fn.name !== "string" || fn.name === "") why = "it has no name";
      else if (fn.description !== undefined && fn.description !== null && typeof fn.description !== "string") why = "its description is not a string";
      else if (fn.parameters !== undefined && fn.parameters !== null && !isPlainObject(fn.parameters)) why = "its parameters are not a JSON schema object";
    }
    if (why !== null) {
      throw new Error(
        "tool spec " + i + " has an unknown shape (" + why + "): " + preview(spec) +
          '; expected {name, description, parameters} or {type: "function", function: {name, description, parameters}}'
      );
    }
    out.push(spec.function !== undefined && spec.type === "function" ? spec : { type: "function", function: fn });
  }
  return out;
}

// Which harness runs an episode_start: "builtin", "user" or "pi". Throws when
// the request cannot be honoured as sent.
function chooseHarness(name, files) {
  if (files !== undefined && files !== null && !isPlainObject(files)) {
    throw new Error("files is not an object of path -> content: " + preview(files));
  }
  var paths = files ? Object.keys(files) : [];
  var listed = paths.slice(0, 5).map(function (p) {
    return JSON.stringify(p);
  }).join(", ") + (paths.length > 5 ? ", ..." : "");
  var hasAgent = paths.indexOf("agent.mjs") !== -1;
  var piNote = PI_MODULES === null ? "" : piUnavailable === null ? ", pi" : "";
  if (name === undefined || name === null || name === "user") {
    if (hasAgent) return "user";
    if (paths.length > 0) {
      throw new Error(
        "the harness files (" + listed + ") hold no agent.mjs: this runner runs a user harness from an agent.mjs " +
          "exporting runEpisode(ctx)" +
          (paths.indexOf("src/agent.ts") !== -1 ? ", and cannot run src/agent.ts (the reference runner's Agent)" : "")
      );
    }
    if (name === "user") throw new Error("the user harness was named but no files (agent.mjs) were sent");
    return "builtin";
  }
  if (name === "builtin" || name === "pi") {
    if (paths.length > 0) throw new Error("the " + name + " harness was named, but harness files (" + listed + ") came too, and it runs none");
    return name;
  }
  throw new Error("unknown harness " + preview(name) + " (this runner knows builtin, user" + piNote + ")");
}

function onEpisodeStart(frame) {
  var id = frame.episode_id;
  if (typeof id !== "string" || id === "") {
    send({
      type: "episode_error",
      episode_id: id === undefined ? null : id,
      note: "episode_start needs a non-empty string episode_id",
    });
    return;
  }
  if (current !== null) {
    send({
      type: "episode_error",
      episode_id: id,
      note: "an episode is already running (" + current.id + "); this runner runs one episode at a time",
    });
    return;
  }
  // An episode_start this runner cannot honour is refused, never run some
  // other way: an agent without its tools, or the builtin loop standing in for
  // the harness that was sent, would still "pass" a task without verify.
  var tools, harness;
  try {
    tools = normalizeTools(frame.tools);
    harness = chooseHarness(frame.harness, frame.files);
  } catch (e) {
    send({ type: "episode_error", episode_id: id, note: "cannot run this episode_start: " + e.message });
    return;
  }
  var episode = {
    id: id,
    ended: false,
    turns: 0,
    keepalive: null,
    start: {
      harness: harness,
      taskId: frame.task_id,
      instruction: typeof frame.instruction === "string" ? frame.instruction : "",
      system: typeof frame.system === "string" ? frame.system : "",
      tools: tools,
      files: harness === "user" ? frame.files : null,
      maxTurns: intAtLeast(frame.max_turns, 1, DEFAULT_MAX_TURNS),
      maxOutputTokens: intAtLeast(frame.max_output_tokens, 1, DEFAULT_MAX_OUTPUT_TOKENS),
      temperature: typeof frame.temperature === "number" && Number.isFinite(frame.temperature) ? frame.temperature : undefined,
    },
  };
  current = episode;
  episode.keepalive = setInterval(function () {
    try {
      send({ type: "transport_keepalive" });
    } catch (e) {
      diag("keepalive write failed: " + String(e));
    }
  }, KEEPALIVE_MS);
  if (typeof episode.keepalive.unref === "function") episode.keepalive.unref();
  driveEpisode(episode).catch(function (e) {
    diag("episode " + episode.id + " failed to report: " + String(e));
  });
}

async function driveEpisode(episode) {
  var harness = episode.start.harness;
  try {
    if (harness === "pi") await runPiHarness(episode);
    else if (harness === "user") await runUserHarness(episode);
    else await runBuiltinHarness(episode);
  } catch (e) {
    if (!episode.ended) {
      await endEpisode(episode, { type: "episode_error", episode_id: episode.id, note: errorNote(e) });
    } else {
      diag("episode " + episode.id + " raised after it ended: " + errorNote(e));
    }
  }
  if (!episode.ended) {
    // defensive: every harness path ends the episode, but never leave it hanging
    await endEpisode(episode, { type: "episode_error", episode_id: episode.id, note: "the harness finished without a result" });
  }
  episode.start = null;
}

function errorNote(e) {
  return String(e);
}

// Ends the episode exactly once: stops the keepalive, fails its outstanding
// requests, then sends the final frame. (A user harness's directory outlives
// the episode: it is shared by every episode with the same files.)
async function endEpisode(episode, frame) {
  if (episode.ended) return;
  episode.ended = true;
  if (episode.keepalive !== null) {
    clearInterval(episode.keepalive);
    episode.keepalive = null;
  }
  pending.forEach(function (entry, reqId) {
    if (entry.episode === episode) {
      pending.delete(reqId);
      entry.reject(new Error("episode " + episode.id + " has ended"));
    }
  });
  if (current === episode) current = null;
  send(frame);
}

function sendDone(episode, reason, answer) {
  return endEpisode(episode, {
    type: "done",
    episode_id: episode.id,
    reason: reason,
    answer: answer,
    turns: episode.turns,
  });
}

function answerText(value) {
  if (value === undefined || value === null) return "";
  if (typeof value === "string") return value;
  if (typeof value === "object") {
    try {
      return JSON.stringify(value);
    } catch (e) {
      return String(value);
    }
  }
  return String(value);
}

// ---------------------------------------------------------------------------
// Builtin harness

function messageText(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    var out = "";
    for (var i = 0; i < content.length; i++) {
      var part = content[i];
      if (part && typeof part === "object" && typeof part.text === "string") out += part.text;
    }
    return out;
  }
  return null;
}

function nudgeFor(reason, maxOutputTokens, warnings) {
  var middle;
  if (reason === "output_truncated") {
    middle =
      "None of the requested actions ran because the reply exceeded " + maxOutputTokens +
      " output tokens. Re-issue the work in chunks well under that limit.";
  } else if (reason === "unparsed_tool_call") {
    middle =
      "Nothing was executed. The tool-call parser reported: " +
      warnings.map(function (w) {
        return typeof w === "string" ? w : answerText(w);
      }).join("; ") +
      ". Emit the call again in the documented format, closing every block.";
  } else {
    middle = "Your reply contained no tool call.";
  }
  return "[ERROR] " + middle + " " + NUDGE_TAIL;
}

function parseArguments(raw) {
  var value = raw;
  if (typeof raw === "string") {
    if (raw.trim() === "") return { ok: true, value: {} };
    try {
      value = JSON.parse(raw);
    } catch (e) {
      return { ok: false, message: e.message };
    }
  } else if (raw === undefined || raw === null) {
    return { ok: true, value: {} };
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    return { ok: false, message: "expected a JSON object, got " + (Array.isArray(value) ? "an array" : value === null ? "null" : typeof value) };
  }
  return { ok: true, value: value };
}

async function runBuiltinHarness(episode) {
  var s = episode.start;
  var messages = [
    { role: "system", content: s.system },
    { role: "user", content: s.instruction },
  ];
  var consecutiveNonAction = 0;
  var lastText = "";

  for (;;) {
    if (episode.turns >= s.maxTurns) {
      await sendDone(episode, "max_turns", lastText);
      return;
    }
    var body = { messages: messages, tools: s.tools, max_tokens: s.maxOutputTokens };
    if (s.temperature !== undefined) body.temperature = s.temperature;
    var reply = await request(episode, "llm_request", { openai_body: body });
    episode.turns += 1;

    if (reply.error !== undefined && reply.error !== null) {
      await sendDone(episode, "provider_error", lastText);
      return;
    }
    var completion = reply.completion;
    var choice =
      completion && typeof completion === "object" && Array.isArray(completion.choices) ? completion.choices[0] : undefined;
    if (!choice || typeof choice !== "object" || !choice.message || typeof choice.message !== "object") {
      diag("episode " + episode.id + ": llm_response " + reply.req_id + " carried no completion.choices[0].message");
      await sendDone(episode, "provider_error", lastText);
      return;
    }
    var message = choice.message;
    var text = messageText(message.content);
    if (text !== null && text.trim() !== "") lastText = text.trim();
    var toolCalls = Array.isArray(message.tool_calls) ? message.tool_calls : [];
    var truncated = choice.finish_reason === "length";

    if (toolCalls.length > 0 && !truncated) {
      messages.push({ role: "assistant", content: text, tool_calls: toolCalls });
      consecutiveNonAction = 0;
      for (var i = 0; i < toolCalls.length; i++) {
        var call = toolCalls[i] || {};
        var fn = call.function && typeof call.function === "object" ? call.function : {};
        var name = typeof fn.name === "string" ? fn.name : "";
        var callId = typeof call.id === "string" ? call.id : "";
        var parsed = parseArguments(fn.arguments);
        if (!parsed.ok) {
          messages.push({
            role: "tool",
            tool_call_id: callId,
            content: "error: could not parse the arguments of " + name + " as JSON: " + parsed.message,
          });
          continue;
        }
        if (name === "submit") {
          await sendDone(episode, "submit", answerText(parsed.value.answer));
          return;
        }
        var result = await request(episode, "tool_request", { name: name, arguments: parsed.value });
        messages.push({
          role: "tool",
          tool_call_id: callId,
          content: typeof result.content === "string" ? result.content : answerText(result.content),
        });
      }
      continue;
    }

    // No action this turn. A truncated reply's tool calls are not run (they may
    // be cut off) and are not echoed back, so the transcript stays valid (no
    // tool_calls without matching tool messages, no assistant turn without content).
    messages.push({ role: "assistant", content: text === null ? "" : text });
    var warnings = Array.isArray(choice.wmo_unparsed_tool_calls) ? choice.wmo_unparsed_tool_calls : [];
    var reason;
    if (warnings.length > 0) reason = "unparsed_tool_call";
    else if (truncated) reason = "output_truncated";
    else reason = "no_tool_call";
    consecutiveNonAction += 1;
    if (consecutiveNonAction < MAX_NONACTION_TURNS && episode.turns < s.maxTurns) {
      messages.push({ role: "user", content: nudgeFor(reason, s.maxOutputTokens, warnings) });
      continue;
    }
    await sendDone(episode, reason, lastText);
    return;
  }
}

// ---------------------------------------------------------------------------
// pi harness (pi_harness.mjs next to this file; the pi packages in WMO_PI_MODULES)

// What pi_harness.mjs may use of the runner. One object for the process.
var PI_KIT = {
  request: request,
  sendDone: sendDone,
  nudgeFor: nudgeFor,
  parseArguments: parseArguments,
  normalizeTools: normalizeTools,
  messageText: messageText,
  answerText: answerText,
  diag: diag,
  maxNonActionTurns: MAX_NONACTION_TURNS,
};

function loadPi() {
  if (piLoading === null) {
    piLoading = import(new URL("./pi_harness.mjs", import.meta.url).href).then(function (mod) {
      return mod.load(PI_MODULES).then(function () {
        return mod;
      });
    });
    // a failed load is retried by the next pi episode
    piLoading.catch(function () {
      piLoading = null;
    });
  }
  return piLoading;
}

async function runPiHarness(episode) {
  if (PI_MODULES === null) {
    throw new Error("the pi harness is not enabled in this runner (WMO_PI_MODULES is not set)");
  }
  if (piUnavailable !== null) throw new Error("the pi harness cannot run here: " + piUnavailable);
  var mod = await loadPi();
  await mod.runEpisode(episode, PI_KIT);
}

// Reads the installed pi version without importing pi. Returns
// {version} or {error}.
async function probePi() {
  if (!(nodeMajor >= PI_MIN_NODE_MAJOR)) {
    return { error: "pi needs Node.js >= " + PI_MIN_NODE_MAJOR + " (found " + process.version + ")" };
  }
  var file = PI_MODULES.replace(/\/+$/, "") + "/@mariozechner/pi-agent-core/package.json";
  try {
    var fs = await import("node:fs");
    var pkg = JSON.parse(fs.readFileSync(file, "utf8"));
    if (typeof pkg.version !== "string") return { error: file + " has no version" };
    return { version: pkg.version };
  } catch (e) {
    return { error: "cannot read " + file + ": " + (e && e.code ? e.code : String(e && e.message ? e.message : e)) };
  }
}

// ---------------------------------------------------------------------------
// User harness (files["agent.mjs"] exporting runEpisode(ctx))

async function loadLazyMods() {
  if (lazyMods === null) {
    var loaded = await Promise.all([
      import("node:fs/promises"),
      import("node:path"),
      import("node:url"),
      import("node:fs"),
      import("node:crypto"),
    ]);
    lazyMods = { fs: loaded[0], path: loaded[1], url: loaded[2], fsSync: loaded[3], crypto: loaded[4] };
  }
  return lazyMods;
}

// Returns [absolutePath, content] pairs or throws an Error naming the bad path.
function planFiles(path, baseDir, files) {
  var plan = [];
  var rels = Object.keys(files);
  for (var i = 0; i < rels.length; i++) {
    var rel = rels[i];
    var content = files[rel];
    var why = null;
    if (rel === "" || rel.trim() === "") why = "the path is empty";
    else if (rel.indexOf("\0") !== -1) why = "the path contains a NUL byte";
    else if (path.isAbsolute(rel) || rel.charAt(0) === "\\" || /^[A-Za-z]:/.test(rel)) why = "the path is absolute";
    else if (rel.split(/[\\/]+/).indexOf("..") !== -1) why = "the path has a '..' component";
    var abs = null;
    if (why === null) {
      abs = path.resolve(baseDir, rel);
      if (abs === baseDir || abs.indexOf(baseDir + path.sep) !== 0) why = "the path resolves outside the harness directory";
    }
    if (why === null && typeof content !== "string") why = "its content is not a string";
    if (why !== null) throw new Error("refusing file " + JSON.stringify(rel) + ": " + why);
    plan.push([abs, content]);
  }
  return plan;
}

// sha256 (hex) of a file set: its paths in sorted order, each with its content.
// Every field is delimited unambiguously (the path JSON-quoted, the content
// length-prefixed), so two different file sets never feed the same bytes.
// Contents are hashed as the UTF-8 bytes written to disk. Non-string contents
// are left out: planFiles refuses such a set anyway.
function hashFiles(crypto, files) {
  var rels = Object.keys(files).sort();
  var h = crypto.createHash("sha256");
  h.update("wmo-harness/1\n");
  for (var i = 0; i < rels.length; i++) {
    var content = files[rels[i]];
    var text = typeof content === "string" ? content : "";
    h.update(JSON.stringify(rels[i]) + "\n" + text.length + "\n");
    h.update(text, "utf8");
  }
  return h.digest("hex");
}

async function writePlan(m, dir, plan) {
  await m.fs.rm(dir, { recursive: true, force: true });
  await m.fs.mkdir(dir, { recursive: true });
  for (var i = 0; i < plan.length; i++) {
    await m.fs.mkdir(m.path.dirname(plan[i][0]), { recursive: true });
    await m.fs.writeFile(plan[i][0], plan[i][1], "utf8");
  }
}

async function exists(m, file) {
  try {
    await m.fs.stat(file);
    return true;
  } catch (e) {
    return false;
  }
}

// The imported agent.mjs namespace for `files`, writing and importing it only
// the first time this runner sees that file set. The directory stays for the
// runner's lifetime: a harness may import its own files lazily, or read them
// through import.meta.url, in any episode.
async function loadUserHarness(files) {
  var m = await loadLazyMods();
  var hash = hashFiles(m.crypto, files);
  var entry = harnesses.get(hash);
  var root = m.path.join(startCwd, HARNESS_ROOT_NAME);
  var dir;
  if (entry !== undefined) dir = entry.dir;
  else {
    var name = hash.slice(0, HARNESS_HASH_CHARS);
    // a clash of the short name between two different file sets: use the whole hash
    if (harnessDirNames.has(name) && harnessDirNames.get(name) !== hash) name = hash;
    dir = m.path.join(root, name);
  }
  // Validate every path (every episode: this is cheap) before writing anything.
  var plan = planFiles(m.path, dir, files);
  if (harnessRoot === null) {
    // A runner killed before it could clean up may have left one behind.
    await m.fs.rm(root, { recursive: true, force: true });
    harnessRoot = root;
  }
  if (entry === undefined) {
    await writePlan(m, dir, plan);
    entry = { dir: dir, url: m.url.pathToFileURL(m.path.join(dir, "agent.mjs")).href, loading: null };
    harnesses.set(hash, entry);
    harnessDirNames.set(m.path.basename(dir), hash);
    var n = harnesses.size;
    if (n > HARNESS_SOFT_CAP && (n === HARNESS_SOFT_CAP + 1 || (n & (n - 1)) === 0)) {
      diag(
        n + " distinct user harnesses in this runner (more than " + HARNESS_SOFT_CAP + "): Node cannot unload " +
          "ES modules, so each new one stays in memory and on disk until the runner exits"
      );
    }
  } else if (!(await exists(m, m.path.join(dir, "agent.mjs")))) {
    // removed behind our back (say by a tool call): the module may be loaded,
    // but the harness may still read or lazily import its files
    diag("the harness directory " + dir + " disappeared; writing it again");
    await writePlan(m, dir, plan);
  }
  if (entry.loading === null) {
    var loading = import(entry.url);
    entry.loading = loading;
    // a failed import is retried by the next episode with these files
    loading.catch(function () {
      if (entry.loading === loading) entry.loading = null;
    });
  }
  return entry.loading;
}

// Removes .wmo-harness at exit, synchronously (an exit handler cannot wait).
function removeHarnessRootSync() {
  if (harnessRoot === null || lazyMods === null) return;
  var root = harnessRoot;
  harnessRoot = null;
  try {
    lazyMods.fsSync.rmSync(root, { recursive: true, force: true });
  } catch (e) {
    diag("could not remove " + root + ": " + String(e));
  }
}

// ctx is made afresh for every episode and bound to it: a ctx kept from an
// earlier episode cannot reach a later one (its calls reject or do nothing once
// its episode has ended). The harness module itself is imported once per
// distinct file set and shared by every episode carrying those files, so its
// module-level state (and anything it writes into its own directory) persists
// from one episode to the next; that state is the harness author's business.
async function runUserHarness(episode) {
  var s = episode.start;
  var mod = await loadUserHarness(s.files);
  if (typeof mod.runEpisode !== "function") {
    throw new Error("agent.mjs does not export a runEpisode function");
  }

  var ctx = {
    episodeId: episode.id,
    taskId: s.taskId,
    instruction: s.instruction,
    system: s.system,
    tools: s.tools,
    maxTurns: s.maxTurns,
    maxOutputTokens: s.maxOutputTokens,
    temperature: s.temperature,
    llm: function (body) {
      return request(episode, "llm_request", { openai_body: body === undefined ? {} : body }).then(function (reply) {
        episode.turns += 1;
        if (reply.error !== undefined && reply.error !== null) throw new Error(answerText(reply.error));
        if (reply.completion === undefined || reply.completion === null) {
          throw new Error("llm_response carried neither completion nor error");
        }
        return reply.completion;
      });
    },
    tool: function (name, args) {
      return request(episode, "tool_request", {
        name: String(name),
        arguments: args === undefined || args === null ? {} : args,
      }).then(function (reply) {
        return {
          content: typeof reply.content === "string" ? reply.content : answerText(reply.content),
          isError: reply.is_error === true,
        };
      });
    },
    submit: function (answer) {
      if (episode.ended) return;
      sendDone(episode, "submit", answerText(answer)).catch(function (e) {
        diag("could not send done for episode " + episode.id + ": " + String(e));
      });
    },
    log: function (message) {
      if (episode.ended) return;
      send({ type: "log", episode_id: episode.id, message: answerText(message) });
    },
  };

  var result = await mod.runEpisode(ctx);
  if (!episode.ended) {
    await sendDone(episode, "no_tool_call", typeof result === "string" ? result : "");
  }
}

// ---------------------------------------------------------------------------
// Process-level failure handling: a stray error from harness code fails the
// running episode instead of killing the runner.

function failCurrent(kind, err) {
  diag(kind + ": " + (err && err.stack ? err.stack : String(err)));
  var episode = current;
  if (episode !== null && !episode.ended) {
    endEpisode(episode, { type: "episode_error", episode_id: episode.id, note: errorNote(err) }).catch(function (e) {
      diag("could not report the failure: " + String(e));
    });
  }
}

process.on("uncaughtException", function (err) {
  failCurrent("uncaught exception", err);
});
process.on("unhandledRejection", function (err) {
  diag("unhandled rejection: " + (err && err.stack ? err.stack : String(err)));
});

// Every way out of the process (shutdown, stdin EOF, a failed stdout, a
// harness calling process.exit) passes here: remove the harness directories.
process.on("exit", removeHarnessRootSync);

function exitNow(code) {
  process.exit(code);
}

stdout.on("error", function (err) {
  // the host closed our output pipe; nothing can be reported any more
  diag("stdout failed (" + String(err && err.code ? err.code : err) + "); exiting");
  exitNow(0);
});

// ---------------------------------------------------------------------------
// Start: stdin, version check, hello.

var stdin = process.stdin;
stdin.on("data", onData);
stdin.on("end", function () {
  exitNow(0);
});
stdin.on("error", function (err) {
  diag("stdin failed: " + String(err));
  exitNow(0);
});

var nodeMajor = Number((/^v(\d+)/.exec(process.version) || [])[1]);
if (!(nodeMajor >= 18)) {
  stderr.write("wmo-e2b runner needs Node.js >= 18 (found " + process.version + ")\n");
  process.exit(3);
}

function hello(extra) {
  var frame = {
    type: "hello",
    protocol: PROTOCOL,
    runner_version: RUNNER_VERSION,
    node_version: process.version,
    harness: "builtin",
    transport: "stdio",
    max_concurrent: 1,
  };
  for (var k in extra) frame[k] = extra[k];
  send(frame);
}

if (PI_MODULES === null) {
  hello({});
} else {
  // pi enabled: say which version is installed (read from its package.json,
  // not imported), or why it cannot run.
  probePi().then(function (found) {
    if (found.version !== undefined) {
      hello({ harnesses: ["builtin", "pi"], pi_version: found.version });
    } else {
      piUnavailable = found.error;
      diag("the pi harness is unavailable: " + found.error);
      hello({ harnesses: ["builtin"], pi_error: found.error });
    }
  });
}
