// wmo-e2b in-sandbox runner.
//
// Started as `node runner.mjs` with stdin/stdout pipes, it runs eval episodes
// one at a time over the frame protocol of frames.mjs (protocol §1): stdout
// carries frames only; everything else goes to stderr.
//
// Dependency-free. It and the modules it imports statically have no imports of
// node: builtins, so the Node version check below runs (and says why) on an
// old Node, and start-up stays fast; what a harness needs is imported lazily.
//
// Harnesses, chosen by episode_start.harness: "builtin" (or absent, with no
// files) runs the loop of loop.mjs; files holding agent.mjs run a user harness
// (user_harness.mjs); "pi" runs the real pi agent loop from pi_harness.mjs,
// enabled when WMO_PI_BUNDLE names the pi bundle (one ES module holding the pi
// packages) and WMO_PI_BUNDLE_SHA256 its digest. pi is imported at the first pi
// episode, never before hello. An
// episode_start naming a harness this runner cannot run, or carrying files or
// tool specs it cannot use, ends in episode_error, never in another harness.

import {
  KEEPALIVE_MS,
  createRequests,
  decodeLine,
  encodeLine,
  exitIfNodeTooOld,
  helloFrame,
  nodeMajor,
  readStdin,
  reserveStdout,
  routeFrame,
} from "./frames.mjs";
import { DEFAULT_MAX_OUTPUT_TOKENS, runToolLoop } from "./loop.mjs";
import { normalizeTools } from "./tool_specs.mjs";
import { finiteOrUndefined, intAtLeast, isObject, preview } from "./values.mjs";

var stderr = process.stderr;
var writeFrameText = reserveStdout(function (text) {
  stderr.write(text + "\n");
});

function diag(message) {
  try {
    stderr.write("wmo-e2b runner: " + message + "\n");
  } catch (e) {
    // stderr is gone; nothing useful left to do
  }
}

var DEFAULT_MAX_TURNS = 20;
// The pi bundle, when the host enabled the pi harness, and the sha256 (hex) the
// host built it with. Nothing of pi is loaded before the first pi episode.
var PI_BUNDLE = envText("WMO_PI_BUNDLE");
var PI_BUNDLE_SHA256 = envText("WMO_PI_BUNDLE_SHA256");
var PI_MIN_NODE_MAJOR = 20;
// The most of a bundle read to check it (the host caps its own at 8 MiB).
var PI_MAX_BUNDLE_BYTES = 8 * 1024 * 1024;

function envText(name) {
  var v = process.env[name];
  return typeof v === "string" && v !== "" ? v : null;
}

// ---------------------------------------------------------------------------
// Process-wide state. Per-episode state lives on the episode object, which is
// dropped when the episode ends.

var current = null; // the running episode, if any
var startCwd = process.cwd();
var piUnavailable = null; // why the pi harness cannot run here, if it cannot

// ---------------------------------------------------------------------------
// Frames

// A frame that cannot be written throws to the caller: a request rejects, and
// a failed stdout ends the process (see the "error" listener below).
function send(frame) {
  writeFrameText(encodeLine(JSON.stringify(frame)));
}

var requests = createRequests(send, diag, function (frame, episode) {
  if (typeof frame.episode_id === "string" && frame.episode_id !== episode.id) {
    return "it names episode " + frame.episode_id + " but the request belongs to " + episode.id;
  }
  return null;
});

var HANDLERS = {
  llm_response: requests.resolveReply,
  tool_response: requests.resolveReply,
  episode_start: onEpisodeStart,
  episode_end: onEpisodeEnd,
  shutdown: function () {
    process.exit(0);
  },
};

function handleLine(line) {
  var frame = decodeLine(line, diag);
  // Every line of this channel is a frame: blank and bad lines are dropped alike.
  if (frame === undefined || frame === null) return;
  routeFrame(frame, HANDLERS, diag);
}

// Sends a request frame for `episode` and returns a promise of the reply frame.
function request(episode, type, fields) {
  if (episode.ended) {
    return Promise.reject(new Error("episode " + episode.id + " has already ended"));
  }
  var withEpisode = { episode_id: episode.id };
  for (var k in fields) withEpisode[k] = fields[k];
  return requests.request(episode, type, withEpisode);
}

// ---------------------------------------------------------------------------
// Episodes

// The user harness's files this runner was sent, by their digest: the host sends
// them with a runner's first episode and names them by digest after that. One set
// is kept (a run has one harness); a restarted runner has none, and its host sends
// them again.
var keptFiles = { digest: null, files: null };

// The files of an episode_start: those sent (kept under their digest, when it
// names one), or the kept ones its digest names. Throws when it names files this
// runner was never sent.
function harnessFiles(files, digest) {
  var sent = isObject(files) && Object.keys(files).length > 0;
  if (typeof digest !== "string" || digest === "") return files;
  if (sent) {
    keptFiles = { digest: digest, files: files };
    return files;
  }
  if (keptFiles.digest === digest) return keptFiles.files;
  throw new Error("the harness files " + digest + " were never sent to this runner (it keeps only what it was sent)");
}

// Which harness runs an episode_start: "builtin", "user" or "pi". Throws when
// the request cannot be honoured as sent.
function chooseHarness(name, files) {
  if (files !== undefined && files !== null && !isObject(files)) {
    throw new Error("files is not an object of path -> content: " + preview(files));
  }
  var paths = files ? Object.keys(files) : [];
  var listed = paths.slice(0, 5).map(function (p) {
    return JSON.stringify(p);
  }).join(", ") + (paths.length > 5 ? ", ..." : "");
  var hasAgent = paths.indexOf("agent.mjs") !== -1;
  var piNote = PI_BUNDLE === null ? "" : piUnavailable === null ? ", pi" : "";
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
  if (name === "builtin" || name === "pi" || name === "endpoint") {
    if (paths.length > 0) throw new Error("the " + name + " harness was named, but harness files (" + listed + ") came too, and it runs none");
    return name;
  }
  throw new Error("unknown harness " + preview(name) + " (this runner knows builtin, user, endpoint" + piNote + ")");
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
  var tools, harness, files, endpoint;
  try {
    files = harnessFiles(frame.files, frame.files_digest);
    tools = normalizeTools(frame.tools);
    harness = chooseHarness(frame.harness, files);
    endpoint = harness === "endpoint" ? endpointSpec(frame.endpoint) : null;
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
      files: harness === "user" ? files : null,
      maxTurns: intAtLeast(frame.max_turns, 1, DEFAULT_MAX_TURNS),
      maxOutputTokens: intAtLeast(frame.max_output_tokens, 1, DEFAULT_MAX_OUTPUT_TOKENS),
      temperature: finiteOrUndefined(frame.temperature),
      endpoint: endpoint,
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
    else if (harness === "endpoint") await runEndpointHarness(episode);
    else if (harness === "user") await runUserHarness(episode);
    else await runBuiltinHarness(episode);
  } catch (e) {
    if (!episode.ended) {
      await endEpisode(episode, { type: "episode_error", episode_id: episode.id, note: String(e) });
    } else {
      diag("episode " + episode.id + " raised after it ended: " + String(e));
    }
  }
  if (!episode.ended) {
    // defensive: every harness path ends the episode, but never leave it hanging
    await endEpisode(episode, { type: "episode_error", episode_id: episode.id, note: "the harness finished without a result" });
  }
  episode.start = null;
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
  requests.settleOwner(episode, function (entry) {
    entry.reject(new Error("episode " + episode.id + " has ended"));
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

function never() {
  return false;
}

function noInput() {
  return [];
}

// The builtin harness: the shared loop, with an episode's wire meanings.
async function runBuiltinHarness(episode) {
  var s = episode.start;
  var conv = {
    messages: [
      { role: "system", content: s.system },
      { role: "user", content: s.instruction },
    ],
    tools: s.tools,
    maxOutputTokens: s.maxOutputTokens,
    temperature: s.temperature,
    turnCap: s.maxTurns,
  };
  var out = await runToolLoop(conv, episode, {
    callModel: function (body) {
      return request(episode, "llm_request", { openai_body: body });
    },
    callTool: function (name, args) {
      return request(episode, "tool_request", { name: name, arguments: args });
    },
    // Nothing stops an episode from outside while it runs: when it ends early
    // (a failure elsewhere), its pending requests reject, which unwinds the loop.
    cutOff: never,
    interrupted: never,
    // An episode's instruction is all its user input; nothing joins it later.
    takeUserInput: noInput,
    hasUserInput: never,
    // Protocol §1: submit ends the episode in the runner; it is never a tool_request.
    submitOnHost: false,
  });
  if (out.end === "submit") return sendDone(episode, "submit", out.answer);
  if (out.end === "model_failed") {
    if (out.malformed) diag("episode " + episode.id + ": " + out.note);
    return sendDone(episode, "provider_error", out.lastText);
  }
  // A reply without a tool call on the last allowed turn reports its own
  // classification (no nudge can follow); a cap reached after tool calls is max_turns.
  if (out.end === "turn_cap") return sendDone(episode, out.why === null ? "max_turns" : out.why, out.lastText);
  if (out.end === "no_action") return sendDone(episode, out.why, out.lastText);
  // "cut_off" cannot happen here; driveEpisode ends an episode left open.
}

// A loader for a module next to this file, imported (then handed to `prepare`,
// when given) at its first use; a failed load is retried at the next use.
function lazyImport(file, prepare) {
  var loading = null;
  return function () {
    if (loading === null) {
      loading = import(new URL(file, import.meta.url).href);
      if (prepare !== undefined) loading = loading.then(prepare);
      loading.catch(function () {
        loading = null;
      });
    }
    return loading;
  };
}

// ---------------------------------------------------------------------------
// User harness (user_harness.mjs; files["agent.mjs"] exporting runEpisode(ctx))

var USER_KIT = {
  cwd: startCwd,
  request: request,
  sendDone: sendDone,
  sendLog: function (episode, message) {
    send({ type: "log", episode_id: episode.id, message: message });
  },
  diag: diag,
};

var loadUserHarness = lazyImport("./user_harness.mjs");

async function runUserHarness(episode) {
  var mod = await loadUserHarness();
  await mod.runEpisode(episode, USER_KIT);
}

// ---------------------------------------------------------------------------
// Endpoint harness (endpoint_harness.mjs): the model APIs served to an agent the
// host runs as a task process.

// The endpoint an episode_start asks for; throws when it is not usable.
function endpointSpec(spec) {
  if (!isObject(spec) || typeof spec.token !== "string" || spec.token.length < 16) {
    throw new Error("the endpoint harness needs endpoint.token (a string of 16 or more characters)");
  }
  return { token: spec.token, model: typeof spec.model === "string" ? spec.model : "" };
}

var ENDPOINT_KIT = { request: request, sendDone: sendDone, send: send, diag: diag };
var loadEndpoint = lazyImport("./endpoint_harness.mjs");

async function runEndpointHarness(episode) {
  var mod = await loadEndpoint();
  await mod.runEpisode(episode, ENDPOINT_KIT);
}

// The host ends an endpoint episode (its agent's process is gone).
function onEpisodeEnd(frame) {
  var episode = current;
  if (episode === null || frame.episode_id !== episode.id || typeof episode.endEndpoint !== "function") return;
  episode.endEndpoint();
}

// ---------------------------------------------------------------------------
// pi harness (pi_harness.mjs; the pi packages in the bundle WMO_PI_BUNDLE)

// What pi_harness.mjs may use of the runner. One object for the process.
var PI_KIT = { request: request, sendDone: sendDone, diag: diag };

var loadPi = lazyImport("./pi_harness.mjs", function (mod) {
  return mod.load(PI_BUNDLE).then(function () {
    return mod;
  });
});

async function runPiHarness(episode) {
  if (PI_BUNDLE === null) {
    throw new Error("the pi harness is not enabled in this runner (WMO_PI_BUNDLE is not set)");
  }
  if (piUnavailable !== null) throw new Error("the pi harness cannot run here: " + piUnavailable);
  var mod = await loadPi();
  await mod.runEpisode(episode, PI_KIT);
}

// Checks the bundle without importing it: its sha256 (against the host's, when
// given) and the pi version its first line names. Returns {version, sha256}, or
// {error} with the sha256 when the file could be read.
async function probePi() {
  if (!(nodeMajor() >= PI_MIN_NODE_MAJOR)) {
    return { error: "pi needs Node.js >= " + PI_MIN_NODE_MAJOR + " (found " + process.version + ")" };
  }
  var file = PI_BUNDLE;
  var bytes;
  try {
    var fs = await import("node:fs");
    var size = fs.statSync(file).size;
    if (size > PI_MAX_BUNDLE_BYTES) return { error: "the pi bundle " + file + " is " + size + " bytes, over " + PI_MAX_BUNDLE_BYTES };
    bytes = fs.readFileSync(file);
  } catch (e) {
    return { error: "cannot read the pi bundle " + file + ": " + (e && e.code ? e.code : String(e && e.message ? e.message : e)) };
  }
  var crypto = await import("node:crypto");
  var sha256 = crypto.createHash("sha256").update(bytes).digest("hex");
  if (PI_BUNDLE_SHA256 !== null && sha256 !== PI_BUNDLE_SHA256.toLowerCase()) {
    return { error: "the pi bundle " + file + " has sha256 " + sha256 + ", not " + PI_BUNDLE_SHA256, sha256: sha256 };
  }
  // The build's banner: "// wmo-e2b pi bundle: @mariozechner/pi-agent-core@<v> ..."
  var end = bytes.indexOf(10);
  var first = bytes.subarray(0, end < 0 ? Math.min(bytes.length, 4096) : Math.min(end, 4096)).toString("utf8");
  var m = /^\/\/ wmo-e2b pi bundle: @mariozechner\/pi-agent-core@(\S+)/.exec(first);
  if (m === null) return { error: file + " is not a wmo-e2b pi bundle (its first line names no pi version)", sha256: sha256 };
  return { version: m[1], sha256: sha256 };
}

// ---------------------------------------------------------------------------
// Process-level failure handling: a stray error from harness code fails the
// running episode instead of killing the runner.

function failCurrent(kind, err) {
  diag(kind + ": " + (err && err.stack ? err.stack : String(err)));
  var episode = current;
  if (episode !== null && !episode.ended) {
    endEpisode(episode, { type: "episode_error", episode_id: episode.id, note: String(err) }).catch(function (e) {
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

process.stdout.on("error", function (err) {
  // the host closed our output pipe; nothing can be reported any more
  diag("stdout failed (" + String(err && err.code ? err.code : err) + "); exiting");
  process.exit(0);
});

// ---------------------------------------------------------------------------
// Start: stdin, version check, hello.

readStdin(handleLine, function (err) {
  diag("stdin failed: " + String(err));
  process.exit(0);
});

exitIfNodeTooOld("wmo-e2b runner");

function hello(extra) {
  var frame = helloFrame({ harness: "builtin", transport: "stdio", max_concurrent: 1 });
  for (var k in extra) frame[k] = extra[k];
  send(frame);
}

if (PI_BUNDLE === null) {
  hello({});
} else {
  // pi enabled: say which version the bundle holds and its digest (checked, not
  // imported), or why it cannot run.
  probePi().then(function (found) {
    var digest = found.sha256 !== undefined ? { pi_bundle_sha256: found.sha256 } : {};
    if (found.version !== undefined) {
      hello(Object.assign({ harnesses: ["builtin", "pi"], pi_version: found.version }, digest));
    } else {
      piUnavailable = found.error;
      diag("the pi harness is unavailable: " + found.error);
      hello(Object.assign({ harnesses: ["builtin"], pi_error: found.error }, digest));
    }
  });
}
