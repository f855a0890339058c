// The user harness of runner.mjs: an episode_start whose files hold agent.mjs
// exporting runEpisode(ctx) runs that function in place of the builtin loop.
//
// runner.mjs imports this module lazily, at the first user-harness episode
// (after its Node version check, so the node: imports below are safe).
//
// A user harness is content-addressed: each distinct file set is written once
// to <cwd>/.wmo-harness/<hash>/ and its agent.mjs imported once, then reused by
// every episode carrying the same files (Node never frees an imported ES
// module, so importing it afresh per episode would leak its whole module graph
// every episode). .wmo-harness is removed when the runner exits.

import { createHash } from "node:crypto";
import { rmSync } from "node:fs";
import { mkdir, rm, stat, writeFile } from "node:fs/promises";
import { basename, dirname, isAbsolute, join, resolve, sep } from "node:path";
import { pathToFileURL } from "node:url";

import { answerText } from "./values.mjs";

var HARNESS_ROOT_NAME = ".wmo-harness";
var HARNESS_HASH_CHARS = 16; // of the sha256 hex, for the directory name
// Past this many distinct harnesses the runner keeps going, but says on stderr
// that each new one stays in memory (and on disk) for the runner's lifetime.
var HARNESS_SOFT_CAP = 16;

// sha256 hex of the file set -> {dir, url, loading}; `loading` is the promise
// of the imported agent.mjs namespace, null until imported (or after a failed
// import, so the next episode tries again).
var harnesses = new Map();
var harnessDirNames = new Map(); // directory name under .wmo-harness -> sha256 hex
var harnessRoot = null; // <cwd>/.wmo-harness once this runner has created it

// Returns [absolutePath, content] pairs or throws an Error naming the bad path.
function planFiles(baseDir, files) {
  var plan = [];
  var rels = Object.keys(files);
  for (var i = 0; i < rels.length; i++) {
    var rel = rels[i];
    var content = files[rel];
    var why = null;
    if (rel === "" || rel.trim() === "") why = "the path is empty";
    else if (rel.indexOf("\0") !== -1) why = "the path contains a NUL byte";
    else if (isAbsolute(rel) || rel.charAt(0) === "\\" || /^[A-Za-z]:/.test(rel)) why = "the path is absolute";
    else if (rel.split(/[\\/]+/).indexOf("..") !== -1) why = "the path has a '..' component";
    var abs = null;
    if (why === null) {
      abs = resolve(baseDir, rel);
      if (abs === baseDir || abs.indexOf(baseDir + sep) !== 0) why = "the path resolves outside the harness directory";
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
function hashFiles(files) {
  var rels = Object.keys(files).sort();
  var h = createHash("sha256");
  h.update("wmo-harness/1\n");
  for (var i = 0; i < rels.length; i++) {
    var content = files[rels[i]];
    var text = typeof content === "string" ? content : "";
    h.update(JSON.stringify(rels[i]) + "\n" + text.length + "\n");
    h.update(text, "utf8");
  }
  return h.digest("hex");
}

async function writePlan(dir, plan) {
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  for (var i = 0; i < plan.length; i++) {
    await mkdir(dirname(plan[i][0]), { recursive: true });
    await writeFile(plan[i][0], plan[i][1], "utf8");
  }
}

async function exists(file) {
  try {
    await stat(file);
    return true;
  } catch (e) {
    return false;
  }
}

// The imported agent.mjs namespace for `files`, writing and importing it only
// the first time this runner sees that file set. The directory stays for the
// runner's lifetime: a harness may import its own files lazily, or read them
// through import.meta.url, in any episode.
async function loadUserHarness(files, cwd, diag) {
  var hash = hashFiles(files);
  var entry = harnesses.get(hash);
  var root = join(cwd, HARNESS_ROOT_NAME);
  var dir;
  if (entry !== undefined) dir = entry.dir;
  else {
    var name = hash.slice(0, HARNESS_HASH_CHARS);
    // a clash of the short name between two different file sets: use the whole hash
    if (harnessDirNames.has(name) && harnessDirNames.get(name) !== hash) name = hash;
    dir = join(root, name);
  }
  // Validate every path (every episode: this is cheap) before writing anything.
  var plan = planFiles(dir, files);
  if (harnessRoot === null) {
    // A runner killed before it could clean up may have left one behind.
    await rm(root, { recursive: true, force: true });
    harnessRoot = root;
    process.on("exit", function () {
      removeHarnessRoot(diag);
    });
  }
  if (entry === undefined) {
    await writePlan(dir, plan);
    entry = { dir: dir, url: pathToFileURL(join(dir, "agent.mjs")).href, loading: null };
    harnesses.set(hash, entry);
    harnessDirNames.set(basename(dir), hash);
    var n = harnesses.size;
    if (n > HARNESS_SOFT_CAP && (n === HARNESS_SOFT_CAP + 1 || (n & (n - 1)) === 0)) {
      diag(
        n + " distinct user harnesses in this runner (more than " + HARNESS_SOFT_CAP + "): Node cannot unload " +
          "ES modules, so each new one stays in memory and on disk until the runner exits"
      );
    }
  } else if (!(await exists(join(dir, "agent.mjs")))) {
    // removed behind our back (say by a tool call): the module may be loaded,
    // but the harness may still read or lazily import its files
    diag("the harness directory " + dir + " disappeared; writing it again");
    await writePlan(dir, plan);
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

// Removes .wmo-harness, synchronously: it runs in an exit handler, which
// cannot wait. Every way out of the process passes there (shutdown, stdin EOF,
// a failed stdout, a harness calling process.exit).
function removeHarnessRoot(diag) {
  if (harnessRoot === null) return;
  var root = harnessRoot;
  harnessRoot = null;
  try {
    rmSync(root, { recursive: true, force: true });
  } catch (e) {
    diag("could not remove " + root + ": " + String(e));
  }
}

// Runs one user-harness episode. `kit` holds what the runner lends the
// harness: cwd (where .wmo-harness goes), request, sendDone, sendLog, diag.
//
// ctx is made afresh for every episode and bound to it: a ctx kept from an
// earlier episode cannot reach a later one (its calls reject or do nothing once
// its episode has ended). The harness module itself is imported once per
// distinct file set and shared by every episode carrying those files, so its
// module-level state (and anything it writes into its own directory) persists
// from one episode to the next; that state is the harness author's business.
export async function runEpisode(episode, kit) {
  var s = episode.start;
  var mod = await loadUserHarness(s.files, kit.cwd, kit.diag);
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
      return kit.request(episode, "llm_request", { openai_body: body === undefined ? {} : body }).then(function (reply) {
        episode.turns += 1;
        if (reply.error !== undefined && reply.error !== null) throw new Error(answerText(reply.error));
        if (reply.completion === undefined || reply.completion === null) {
          throw new Error("llm_response carried neither completion nor error");
        }
        return reply.completion;
      });
    },
    tool: function (name, args) {
      return kit.request(episode, "tool_request", {
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
      kit.sendDone(episode, "submit", answerText(answer)).catch(function (e) {
        kit.diag("could not send done for episode " + episode.id + ": " + String(e));
      });
    },
    log: function (message) {
      if (episode.ended) return;
      kit.sendLog(episode, answerText(message));
    },
  };

  var result = await mod.runEpisode(ctx);
  if (!episode.ended) {
    await kit.sendDone(episode, "no_tool_call", typeof result === "string" ? result : "");
  }
}
