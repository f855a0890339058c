// wmo-e2b live-session runner.
//
// Started as `node live.mjs` in a project sandbox. One process serves one
// session of one or more turns. Frames travel one per line in both
// directions: standard base64 (with padding) of the UTF-8 JSON text of one
// object, then "\n". stdout carries frames only; everything else goes to
// stderr.
//
// Host -> runner: session_start, user_message, abort, ping, llm_response,
// tool_response, shutdown. Runner -> host: hello, state, llm_request,
// tool_request, pong, episode_error, transport_keepalive (and, in durable
// mode, transport_ack / transport_nack).
//
// Turn end reasons on the terminal `state{status:"idle"}`:
//   completed     the model called `submit` and the host answered it
//   aborted       the host sent `abort` (or answered a request with the
//                 interrupt marker "interrupted")
//   turn_limit    `turn_cap` model calls were made without a submit
//   no_tool_call  three replies in a row carried no runnable tool call
//   error         a model call failed, or the loop itself failed; an
//                 `episode_error{note}` is sent just before this idle
//
// Durable mode (env WMO_LIVE_OUTBOX=<dir>): every outbound frame except the
// keepalive is first committed to <dir>/frames/<seq:020>.json and <dir>/head,
// then written to stdout as {"transport_seq": n, "frame": ...}; every inbound
// line is {"transport_in_seq": n, "frame": ...} and is acked or nacked. If the
// host loses stdout, the process lives on and the frames keep landing on disk.
//
// Dependency-free and without static imports, so start-up stays fast and the
// Node version check runs first. `node:fs` is loaded only in durable mode.

// ---------------------------------------------------------------------------
// stdout hygiene: keep the real stdout writer for frames, send everything
// else (console.*, stray process.stdout.write calls) to stderr.

var stdout = process.stdout;
var stderr = process.stderr;
var writeStdout = stdout.write.bind(stdout);

function toText(a) {
  if (typeof a === "string") return a;
  if (a instanceof Error) return a.stack || String(a);
  try {
    return JSON.stringify(a);
  } catch (e) {
    return String(a);
  }
}

function errText(e) {
  if (e && e.code) return String(e.code) + (e.message ? " " + e.message : "");
  return String(e && e.message ? e.message : e);
}

// Writes one line of diagnostics to stderr and, in durable mode, appends it
// to <outbox>/stderr.log.
function writeDiag(text) {
  var line = text.endsWith("\n") ? text : text + "\n";
  try {
    stderr.write(line);
  } catch (e) {
    // stderr is gone; the log file below may still work
  }
  if (outbox !== null) {
    try {
      outbox.fs.appendFileSync(outbox.stderrPath, line);
    } catch (e) {
      // nothing useful left to do
    }
  }
}

function diag(message) {
  writeDiag("wmo-e2b live runner: " + message);
}

function consoleToStderr() {
  var parts = [];
  for (var i = 0; i < arguments.length; i++) parts.push(toText(arguments[i]));
  writeDiag(parts.join(" "));
}

console.log = consoleToStderr;
console.info = consoleToStderr;
console.warn = consoleToStderr;
console.debug = consoleToStderr;
stdout.write = function () {
  return stderr.write.apply(stderr, arguments);
};

// ---------------------------------------------------------------------------
// Constants

var PROTOCOL = 1;
var RUNNER_VERSION = "0.1.0";
var MAX_NONACTION_TURNS = 3;
var DEFAULT_TURN_CAP = 60;
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
// What a pending request resolves to when its turn is aborted or ended.
var INTERRUPTED = { interrupted: true };
// The host answers a request with this when it interrupted the turn itself
// (an llm_response error, or a tool_response content with is_error).
var HOST_INTERRUPT_MARKER = "interrupted";

// ---------------------------------------------------------------------------
// Process-wide state

var outbox = null; // durable outbox, when WMO_LIVE_OUTBOX is set
var outputDead = false; // stdout failed; in durable mode frames still go to disk
var lastIn = 0; // durable mode: last inbound transport_in_seq dispatched
var nextReqId = 1;
var pending = new Map(); // req_id -> {kind, turn, resolve}
var session = null; // set by session_start; one per process

// ---------------------------------------------------------------------------
// Output

function encodeLine(json) {
  return Buffer.from(json, "utf8").toString("base64") + "\n";
}

function writeLine(json) {
  if (outputDead) return;
  if (stdout.destroyed) {
    onOutputFailure(new Error("stdout is closed"));
    return;
  }
  try {
    writeStdout(encodeLine(json));
  } catch (e) {
    onOutputFailure(e);
  }
}

function onOutputFailure(err) {
  if (outbox === null) {
    // stdio transport: nothing can be reported any more
    diag("stdout failed (" + errText(err) + "); exiting");
    process.exit(0);
  }
  if (!outputDead) {
    outputDead = true;
    diag("stdout failed (" + errText(err) + "); frames continue in the durable outbox " + outbox.dir);
  }
}

// Sends one runner frame: published through the outbox in durable mode,
// straight to stdout otherwise.
function send(frame) {
  if (outbox !== null) publish(frame);
  else writeLine(JSON.stringify(frame));
}

// Keepalives are never enveloped or persisted.
function sendKeepalive() {
  writeLine('{"type":"transport_keepalive"}');
}

function sendEpisodeError(note) {
  send({ type: "episode_error", note: note });
}

// ---------------------------------------------------------------------------
// Durable outbox

function framePath(seq) {
  return outbox.framesDir + "/" + String(seq).padStart(20, "0") + ".json";
}

// Writes `text` to `target` through an exclusively created temp sibling and a
// rename. No fsync: durability covers a lost stream, not a lost machine.
function atomicWrite(target, text) {
  var slash = target.lastIndexOf("/");
  var tmp =
    target.slice(0, slash + 1) + "." + target.slice(slash + 1) + ".tmp-" + process.pid + "-" +
    Date.now().toString(36) + "-" + process.hrtime.bigint().toString(36) + "-" + (outbox.counter++).toString(36);
  try {
    outbox.fs.writeFileSync(tmp, text, { flag: "wx" });
    outbox.fs.renameSync(tmp, target);
  } catch (e) {
    try {
      outbox.fs.unlinkSync(tmp);
    } catch (e2) {
      // best effort
    }
    throw e;
  }
}

// Commits the frame file, then the head, then writes the envelope to stdout.
// A frame that cannot be committed cannot be delivered reliably: exit 1.
function publish(frame) {
  var seq = outbox.last + 1;
  var json = JSON.stringify({ transport_seq: seq, frame: frame });
  try {
    atomicWrite(framePath(seq), json + "\n");
    atomicWrite(outbox.headPath, seq + "\n");
  } catch (e) {
    diag("durable outbox write failed for frame " + seq + " (" + frame.type + "): " + errText(e) + "; exiting");
    process.exit(1);
  }
  outbox.last = seq;
  writeLine(json);
}

// Returns null when the outbox is ready, else a message saying why not.
async function openOutbox(dir) {
  var fs = await import("node:fs");
  var path = await import("node:path");
  var root = path.resolve(dir);
  outbox = {
    fs: fs,
    dir: root,
    framesDir: path.join(root, "frames"),
    headPath: path.join(root, "head"),
    stderrPath: path.join(root, "stderr.log"),
    last: 0,
    counter: 0,
  };
  try {
    fs.mkdirSync(outbox.framesDir, { recursive: true });
  } catch (e) {
    return "cannot create " + outbox.framesDir + ": " + errText(e);
  }
  var text = null;
  try {
    text = fs.readFileSync(outbox.headPath, "utf8");
  } catch (e) {
    if (!e || e.code !== "ENOENT") return "cannot read " + outbox.headPath + ": " + errText(e);
  }
  if (text === null) {
    try {
      atomicWrite(outbox.headPath, "0\n");
    } catch (e) {
      return "cannot write " + outbox.headPath + ": " + errText(e);
    }
    return null;
  }
  var trimmed = text.trim();
  var n = /^[0-9]+$/.test(trimmed) ? Number(trimmed) : NaN;
  if (!Number.isSafeInteger(n)) {
    return outbox.headPath + " holds " + JSON.stringify(text.slice(0, 40)) + ", not an integer >= 0";
  }
  outbox.last = n;
  return null;
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
  if (start === 0) partial.push(chunk);
  else if (start < chunk.length) partial.push(Buffer.from(chunk.subarray(start)));
}

// Returns the JSON object a line carries, undefined for a blank line, or null
// (after a diagnostic) for anything else.
function decodeLine(line) {
  var text = line.toString("latin1").trim();
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

function isObject(value) {
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

// Tool specs arrive flat ({name, description, parameters}, the reference
// runtime's shape) or in OpenAI's {type: "function", function: {...}}; both
// become OpenAI's, which the chat-completions body needs. Anything else
// throws, naming the spec: a session must not run without tools it was given.
// The same rules as normalizeTools in runner.mjs (this file runs on its own,
// so it cannot import that one).
function normalizeTools(list) {
  if (list === undefined || list === null) return [];
  if (!Array.isArray(list)) throw new Error("tools is not a list of tool specs: " + preview(list));
  var out = [];
  for (var i = 0; i < list.length; i++) {
    var spec = list[i];
    var why = null;
    var fn = null;
    if (!isObject(spec)) why = "it is not an object";
    else if (spec.type !== undefined && spec.type !== "function") why = "its type is " + preview(spec.type) + ', not "function"';
    else if (spec.function !== undefined) {
      if (isObject(spec.function)) fn = spec.function;
      else why = "its function is not an object";
    } else {
      fn = {};
      for (var k in spec) if (k !== "type") fn[k] = spec[k];
    }
    if (why === null) {
      if (typeof fn.name !== "string" || fn.name === "") why = "it has no name";
      else if (fn.description !== undefined && fn.description !== null && typeof fn.description !== "string") why = "its description is not a string";
      else if (fn.parameters !== undefined && fn.parameters !== null && !isObject(fn.parameters)) why = "its parameters are not a JSON schema object";
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

function handleLine(line) {
  var value = decodeLine(line);
  if (value === undefined) return;
  if (outbox === null) {
    if (value !== null) dispatchSafe(value);
    return;
  }
  // Durable: every line must be an inbound envelope.
  var n = value === null ? null : value.transport_in_seq;
  var validSeq = typeof n === "number" && Number.isSafeInteger(n) && n > 0;
  if (!validSeq || !isObject(value.frame)) {
    send({ type: "transport_nack", transport_in_seq: n === undefined ? null : n, expected_transport_in_seq: lastIn + 1 });
    return;
  }
  if (n <= lastIn) {
    send({ type: "transport_ack", transport_in_seq: n }); // a duplicate: ack again, never re-dispatch
    return;
  }
  if (n !== lastIn + 1) {
    send({ type: "transport_nack", transport_in_seq: n, expected_transport_in_seq: lastIn + 1 });
    return;
  }
  lastIn = n;
  if (value.frame.type === "shutdown") {
    send({ type: "transport_ack", transport_in_seq: n });
    process.exit(0);
  }
  // Dispatch first, so frames it emits synchronously (pong, state:running)
  // precede the ack.
  dispatchSafe(value.frame);
  send({ type: "transport_ack", transport_in_seq: n });
}

function dispatchSafe(frame) {
  if (typeof frame.type !== "string") {
    diag("ignored an inbound frame without a string type");
    return;
  }
  try {
    dispatch(frame);
  } catch (e) {
    diag("error while handling a " + frame.type + " frame: " + toText(e));
  }
}

function dispatch(frame) {
  switch (frame.type) {
    case "llm_response":
    case "tool_response":
      resolveReply(frame);
      return;
    case "session_start":
      onSessionStart(frame);
      return;
    case "user_message":
      onUserMessage(frame);
      return;
    case "abort":
      onAbort();
      return;
    case "ping":
      send({ type: "pong", nonce: frame.nonce === undefined ? null : frame.nonce });
      return;
    case "shutdown":
      process.exit(0);
      return;
    default:
      // unknown frame types are ignored
      return;
  }
}

// ---------------------------------------------------------------------------
// Requests and strict correlation

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
  pending.delete(id);
  entry.resolve(frame);
}

// Sends a request frame for `turn`; resolves to the reply frame, or to
// INTERRUPTED when the turn is aborted or ended first (then nothing is sent).
function request(turn, type, fields) {
  if (turn.aborted || turn.ended) return Promise.resolve(INTERRUPTED);
  var reqId = nextReqId++;
  var frame = { type: type, req_id: reqId };
  for (var k in fields) frame[k] = fields[k];
  return new Promise(function (resolve) {
    pending.set(reqId, { kind: REPLY_KIND[type], turn: turn, resolve: resolve });
    send(frame);
  });
}

function interruptPending(turn) {
  pending.forEach(function (entry, reqId) {
    if (entry.turn === turn) {
      pending.delete(reqId);
      entry.resolve(INTERRUPTED);
    }
  });
}

// ---------------------------------------------------------------------------
// Session and turns

function intAtLeast(value, min, fallback) {
  return typeof value === "number" && Number.isInteger(value) && value >= min ? value : fallback;
}

function onSessionStart(frame) {
  if (session !== null) {
    sendEpisodeError("session_start: session " + session.id + " is already started; one session per runner process");
    return;
  }
  if (typeof frame.session_id !== "string" || frame.session_id === "") {
    sendEpisodeError("session_start needs a non-empty string session_id");
    return;
  }
  var tools;
  try {
    tools = normalizeTools(frame.tools);
  } catch (e) {
    sendEpisodeError("session_start: " + e.message);
    return;
  }
  var system = typeof frame.system === "string" ? frame.system : "";
  session = {
    id: frame.session_id,
    system: system,
    tools: tools,
    turnCap: intAtLeast(frame.turn_cap, 1, DEFAULT_TURN_CAP),
    maxOutputTokens: intAtLeast(frame.max_output_tokens, 1, DEFAULT_MAX_OUTPUT_TOKENS),
    temperature: typeof frame.temperature === "number" && Number.isFinite(frame.temperature) ? frame.temperature : undefined,
    scope: frame.conversation_scope === "turn" ? "turn" : "session",
    messages: [{ role: "system", content: system }],
    lastMsgId: null,
    turn: null,
  };
  send({ type: "state", status: "idle", turns: 0 });
}

function onUserMessage(frame) {
  if (session === null) {
    sendEpisodeError("user_message arrived before session_start");
    return;
  }
  if (typeof frame.msg_id !== "string" || typeof frame.text !== "string") {
    sendEpisodeError("user_message needs a string msg_id and a string text");
    return;
  }
  session.lastMsgId = frame.msg_id;
  var turn = session.turn;
  if (turn !== null) {
    // a steer: it joins the conversation before the turn's next model call
    turn.steers.push({ msgId: frame.msg_id, text: frame.text });
    return;
  }
  startTurn(session, frame.msg_id, frame.text);
}

function startTurn(s, msgId, text) {
  if (s.scope === "turn") s.messages = [{ role: "system", content: s.system }];
  s.messages.push({ role: "user", content: text });
  var turn = { msgId: msgId, turns: 0, steers: [], aborted: false, ended: false };
  s.turn = turn;
  send({ type: "state", status: "running", turns: 0, msg_id: msgId });
  // Start the loop after the current input is handled, so in durable mode the
  // ack of this user_message comes before the first llm_request, and an abort
  // in the same read stops the turn before it sends anything.
  Promise.resolve().then(function () {
    return runTurn(s, turn);
  });
}

function onAbort() {
  var turn = session === null ? null : session.turn;
  if (turn === null || turn.aborted || turn.ended) return; // idle: nothing to abort
  turn.aborted = true;
  interruptPending(turn);
}

async function runTurn(s, turn) {
  var reason;
  try {
    reason = await turnLoop(s, turn);
  } catch (e) {
    if (turn.ended) {
      diag("turn " + turn.msgId + " raised after it ended: " + toText(e));
      return;
    }
    diag("turn " + turn.msgId + " failed: " + toText(e));
    sendEpisodeError("live runner error: " + errText(e));
    reason = "error";
  }
  finishTurn(s, turn, reason);
}

// Ends the turn exactly once: unblocks its outstanding requests, answers
// orphaned tool calls in the transcript, then sends the terminal idle.
function finishTurn(s, turn, reason) {
  if (turn.ended) return;
  turn.ended = true;
  interruptPending(turn);
  repairToolCalls(s.messages, reason === "aborted" ? "cancelled by user" : "not run: the turn ended first");
  var cleared = turn.steers.map(function (st) {
    return st.msgId;
  });
  turn.steers = [];
  if (s.turn === turn) s.turn = null;
  var frame = { type: "state", status: "idle", turns: turn.turns, reason: reason, msg_id: s.lastMsgId };
  if (cleared.length > 0) frame.cleared_steers = cleared;
  send(frame);
}

// Gives every tool call of the last assistant message a tool result, so the
// next turn of a "session"-scoped conversation is a valid transcript.
function repairToolCalls(messages, text) {
  var i = messages.length - 1;
  while (i >= 0 && messages[i].role === "tool") i--;
  if (i < 0 || messages[i].role !== "assistant" || !Array.isArray(messages[i].tool_calls)) return;
  var answered = new Set();
  for (var j = i + 1; j < messages.length; j++) answered.add(messages[j].tool_call_id);
  var calls = messages[i].tool_calls;
  for (var k = 0; k < calls.length; k++) {
    var id = calls[k] && typeof calls[k].id === "string" ? calls[k].id : "";
    if (!answered.has(id)) {
      answered.add(id);
      messages.push({ role: "tool", tool_call_id: id, content: text });
    }
  }
}

// ---------------------------------------------------------------------------
// Builtin tool-calling loop

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
  if (!isObject(value)) {
    return { ok: false, message: "expected a JSON object, got " + (Array.isArray(value) ? "an array" : value === null ? "null" : typeof value) };
  }
  return { ok: true, value: value };
}

function stopped(turn) {
  return turn.aborted || turn.ended;
}

function hostInterrupted(reply) {
  return reply.is_error === true && reply.content === HOST_INTERRUPT_MARKER;
}

// Runs the turn; returns its end reason. Sends episode_error itself for a
// failed model call.
async function turnLoop(s, turn) {
  var consecutiveNonAction = 0;
  for (;;) {
    if (stopped(turn)) return "aborted";
    if (turn.turns >= s.turnCap) return "turn_limit";
    if (turn.steers.length > 0) {
      for (var q = 0; q < turn.steers.length; q++) s.messages.push({ role: "user", content: turn.steers[q].text });
      turn.steers = [];
      consecutiveNonAction = 0; // fresh user input: the nudge budget starts over
    }
    var body = { messages: s.messages, tools: s.tools, max_tokens: s.maxOutputTokens };
    if (s.temperature !== undefined) body.temperature = s.temperature;
    var reply = await request(turn, "llm_request", { openai_body: body });
    if (reply === INTERRUPTED || stopped(turn)) return "aborted";
    var failed = reply.error !== undefined && reply.error !== null;
    if (failed && reply.error === HOST_INTERRUPT_MARKER) return "aborted";
    turn.turns += 1; // every answered model call counts, a failed one too
    if (failed) {
      sendEpisodeError("model call failed: " + answerText(reply.error));
      return "error";
    }
    var completion = reply.completion;
    var choice = isObject(completion) && Array.isArray(completion.choices) ? completion.choices[0] : undefined;
    if (!isObject(choice) || !isObject(choice.message)) {
      sendEpisodeError("model call failed: llm_response " + reply.req_id + " carried no completion.choices[0].message");
      return "error";
    }
    var message = choice.message;
    var text = messageText(message.content);
    var toolCalls = Array.isArray(message.tool_calls) ? message.tool_calls : [];
    var truncated = choice.finish_reason === "length";

    if (toolCalls.length > 0 && !truncated) {
      s.messages.push({ role: "assistant", content: text, tool_calls: toolCalls });
      consecutiveNonAction = 0;
      for (var i = 0; i < toolCalls.length; i++) {
        var call = toolCalls[i] || {};
        var fn = isObject(call.function) ? call.function : {};
        var name = typeof fn.name === "string" ? fn.name : "";
        var callId = typeof call.id === "string" ? call.id : "";
        var parsed = parseArguments(fn.arguments);
        if (!parsed.ok) {
          s.messages.push({
            role: "tool",
            tool_call_id: callId,
            content: "error: could not parse the arguments of " + name + " as JSON: " + parsed.message,
          });
          continue;
        }
        var args = name === "submit" ? { answer: answerText(parsed.value.answer) } : parsed.value;
        var result = await request(turn, "tool_request", { name: name, arguments: args });
        if (result === INTERRUPTED || stopped(turn)) return "aborted";
        s.messages.push({
          role: "tool",
          tool_call_id: callId,
          content: typeof result.content === "string" ? result.content : answerText(result.content),
        });
        if (hostInterrupted(result)) return "aborted";
        if (name === "submit") return "completed";
      }
      continue;
    }

    // No action this turn. A truncated reply's tool calls are not run (they
    // may be cut off) and are not echoed back, so the transcript stays valid.
    s.messages.push({ role: "assistant", content: text === null ? "" : text });
    var warnings = Array.isArray(choice.wmo_unparsed_tool_calls) ? choice.wmo_unparsed_tool_calls : [];
    var why = warnings.length > 0 ? "unparsed_tool_call" : truncated ? "output_truncated" : "no_tool_call";
    consecutiveNonAction += 1;
    // A steer that arrived meanwhile is fresh user input: it goes to the model
    // instead of a nudge, and the turn does not end for lack of a tool call.
    var steered = turn.steers.length > 0;
    if (!steered && consecutiveNonAction >= MAX_NONACTION_TURNS) return "no_tool_call";
    if (turn.turns >= s.turnCap) return "turn_limit";
    if (steered) continue;
    s.messages.push({ role: "user", content: nudgeFor(why, s.maxOutputTokens, warnings) });
  }
}

// ---------------------------------------------------------------------------
// Process-level failure handling: a stray error fails the running turn
// instead of killing the runner.

process.on("uncaughtException", function (err) {
  diag("uncaught exception: " + toText(err));
  var turn = session === null ? null : session.turn;
  if (turn !== null && !turn.ended) {
    sendEpisodeError("live runner error: " + errText(err));
    finishTurn(session, turn, "error");
  }
});
process.on("unhandledRejection", function (err) {
  diag("unhandled rejection: " + toText(err));
});

// ---------------------------------------------------------------------------
// Start: version check, outbox, stdin, keepalive, hello.

async function main() {
  var nodeMajor = Number((/^v(\d+)/.exec(process.version) || [])[1]);
  if (!(nodeMajor >= 18)) {
    stderr.write("wmo-e2b live runner needs Node.js >= 18 (found " + process.version + ")\n");
    process.exit(3);
  }
  var outboxDir = typeof process.env.WMO_LIVE_OUTBOX === "string" ? process.env.WMO_LIVE_OUTBOX.trim() : "";
  if (outboxDir !== "") {
    var problem = await openOutbox(outboxDir);
    if (problem !== null) {
      diag("cannot start the durable outbox: " + problem);
      process.exit(3);
    }
  }

  stdout.on("error", onOutputFailure);
  var stdin = process.stdin;
  stdin.on("data", onData);
  stdin.on("end", function () {
    process.exit(0);
  });
  stdin.on("error", function (err) {
    diag("stdin failed: " + errText(err));
    process.exit(0);
  });

  var keepalive = setInterval(sendKeepalive, KEEPALIVE_MS);
  if (typeof keepalive.unref === "function") keepalive.unref();

  send({
    type: "hello",
    protocol: PROTOCOL,
    runner_version: RUNNER_VERSION,
    node_version: process.version,
    mode: "session",
    transport: outbox === null ? "stdio" : "durable",
  });
}

main().catch(function (e) {
  diag("start-up failed: " + toText(e));
  process.exit(3);
});
