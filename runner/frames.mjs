// Frame plumbing shared by the two runners: runner.mjs (eval episodes,
// protocol §1) and live.mjs (live sessions, protocol §2).
//
// Frames travel one per line in both directions: standard base64 (with
// padding) of the UTF-8 JSON text of one object, then "\n". stdout carries
// frames only; everything else goes to stderr.
//
// A runner imports this module before its Node version check runs, so it has
// no imports of node: builtins (an old Node that cannot load them must still
// get to the check and say why it cannot run).

import { isObject, toText } from "./values.mjs";

export var PROTOCOL = 1;
export var RUNNER_VERSION = "0.1.0";
export var MIN_NODE_MAJOR = 18;
// The host recognises this exit code as "Node.js is too old" and does not retry.
export var EXIT_NODE_TOO_OLD = 3;

// How often a runner tells the host it is alive; WMO_KEEPALIVE_MS overrides it
// (the tests shorten it).
export var KEEPALIVE_MS = (function () {
  var raw = process.env.WMO_KEEPALIVE_MS;
  var n = raw === undefined ? NaN : Number(raw);
  return Number.isFinite(n) && n > 0 ? Math.floor(n) : 30000;
})();

// The reply frame type that answers each request frame type.
var REPLY_KIND = { llm_request: "llm_response", tool_request: "tool_response" };

// ---------------------------------------------------------------------------
// stdout hygiene

// Keeps stdout for frames: console.log/info/warn/debug and stray
// process.stdout.write calls (from a harness, say) go to `sink` and stderr
// instead. Returns the real stdout writer, the only way left to write a frame.
// `sink(text)` receives one console call's arguments joined by spaces.
export function reserveStdout(sink) {
  var stdout = process.stdout;
  var stderr = process.stderr;
  var writeFrameText = stdout.write.bind(stdout);
  var toSink = function () {
    var parts = [];
    for (var i = 0; i < arguments.length; i++) parts.push(toText(arguments[i]));
    sink(parts.join(" "));
  };
  console.log = toSink;
  console.info = toSink;
  console.warn = toSink;
  console.debug = toSink;
  stdout.write = function () {
    return stderr.write.apply(stderr, arguments);
  };
  return writeFrameText;
}

// ---------------------------------------------------------------------------
// Lines

// One line of the channel carrying `json`, the JSON text of one object.
export function encodeLine(json) {
  return Buffer.from(json, "utf8").toString("base64") + "\n";
}

// Returns a stdin "data" listener that calls onLine(Buffer) for every complete
// line. Lines stay bytes until they are whole: one may be many MB, and a read
// may end inside it.
export function lineSplitter(onLine) {
  var partial = [];
  return function onData(chunk) {
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
      onLine(line);
    }
    if (start === 0) partial.push(chunk);
    // copy so a small tail does not pin the whole read chunk
    else if (start < chunk.length) partial.push(Buffer.from(chunk.subarray(start)));
  };
}

// Returns the JSON object a line carries, undefined for a blank line, or null
// (after a diagnostic) for anything else. Surrounding white space is ignored.
export function decodeLine(line, diag) {
  var text;
  try {
    text = line.toString("latin1").trim();
  } catch (e) {
    // past the longest string this Node can hold
    diag("dropped an undecodable inbound line (" + line.length + " bytes): " + String(e));
    return null;
  }
  if (text === "") return undefined;
  var value;
  try {
    value = JSON.parse(Buffer.from(text, "base64").toString("utf8"));
  } catch (e) {
    diag("dropped an inbound line that is not base64 JSON (" + text.length + " chars): " + e.message);
    return null;
  }
  if (!isObject(value)) {
    diag("dropped an inbound line that is not a JSON object");
    return null;
  }
  return value;
}

// Hands an inbound frame to handlers[frame.type]. Frame types without a
// handler are ignored: a newer host may send frames this runner does not know.
// A handler that throws costs a diagnostic, never the runner.
export function routeFrame(frame, handlers, diag) {
  if (typeof frame.type !== "string") {
    diag("ignored an inbound frame without a string type");
    return;
  }
  if (!Object.prototype.hasOwnProperty.call(handlers, frame.type)) return;
  try {
    handlers[frame.type](frame);
  } catch (e) {
    diag("error while handling a " + frame.type + " frame: " + toText(e));
  }
}

// ---------------------------------------------------------------------------
// Requests and strict correlation

// The runner's outstanding requests (llm_request, tool_request) and their
// replies. A reply resolves its request only when its req_id (a number) and
// its kind match; anything else (late, duplicate, misdirected) is dropped with
// a diagnostic, never applied to another request.
//
// `foreignReply(frame, owner)` returns why a reply that matches by req_id and
// kind still belongs elsewhere, or null. The runners differ here: episode
// frames name their episode, so runner.mjs checks it; live-session frames name
// no session or turn, so live.mjs passes null.
export function createRequests(send, diag, foreignReply) {
  var nextReqId = 1;
  var pending = new Map(); // req_id -> {kind, owner, resolve, reject}

  // Sends a `type` frame with a fresh req_id followed by `fields`, for `owner`
  // (an episode, a turn); resolves to the reply frame. Rejects when the frame
  // cannot be written, or when settleOwner rejects it.
  function request(owner, type, fields) {
    var reqId = nextReqId++;
    var frame = { type: type, req_id: reqId };
    for (var k in fields) frame[k] = fields[k];
    return new Promise(function (resolve, reject) {
      pending.set(reqId, { kind: REPLY_KIND[type], owner: owner, resolve: resolve, reject: reject });
      try {
        send(frame);
      } catch (e) {
        pending.delete(reqId);
        reject(e);
      }
    });
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
    var why = foreignReply === null ? null : foreignReply(frame, entry.owner);
    if (why !== null) {
      diag("ignored " + frame.type + " for req_id " + id + ": " + why);
      return;
    }
    pending.delete(id);
    entry.resolve(frame);
  }

  // Forgets every outstanding request of `owner`, handing each to
  // settle({resolve, reject}) so the code awaiting it moves on.
  function settleOwner(owner, settle) {
    pending.forEach(function (entry, reqId) {
      if (entry.owner === owner) {
        pending.delete(reqId);
        settle(entry);
      }
    });
  }

  return { request: request, resolveReply: resolveReply, settleOwner: settleOwner };
}

// ---------------------------------------------------------------------------
// Start-up

export function nodeMajor() {
  return Number((/^v(\d+)/.exec(process.version) || [])[1]);
}

// Exits with EXIT_NODE_TOO_OLD, saying why on stderr, when this Node is older
// than the runners support. `who` names the runner in the message.
export function exitIfNodeTooOld(who) {
  if (!(nodeMajor() >= MIN_NODE_MAJOR)) {
    process.stderr.write(who + " needs Node.js >= " + MIN_NODE_MAJOR + " (found " + process.version + ")\n");
    process.exit(EXIT_NODE_TOO_OLD);
  }
}

// Reads frames' lines from stdin. EOF means the host is gone: exit 0.
export function readStdin(onLine, onError) {
  var stdin = process.stdin;
  stdin.on("data", lineSplitter(onLine));
  stdin.on("end", function () {
    process.exit(0);
  });
  stdin.on("error", onError);
}

// The hello frame: the fields both runners send, then `fields`.
export function helloFrame(fields) {
  var frame = { type: "hello", protocol: PROTOCOL, runner_version: RUNNER_VERSION, node_version: process.version };
  for (var k in fields) frame[k] = fields[k];
  return frame;
}
