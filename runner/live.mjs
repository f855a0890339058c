// wmo-e2b live-session runner.
//
// Started as `node live.mjs` in a project sandbox. One process serves one
// session of one or more turns, over the frame protocol of frames.mjs
// (protocol §2): stdout carries frames only; everything else goes to stderr.
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
// keepalive is first committed to the outbox (outbox.mjs, protocol §3), then
// written to stdout as {"transport_seq": n, "frame": ...}; every inbound line
// is {"transport_in_seq": n, "frame": ...} and is acked or nacked. If the host
// loses stdout, the process lives on and the frames keep landing on disk.
//
// Dependency-free. It and the modules it imports statically have no imports of
// node: builtins, so the Node version check runs first (and says why on an old
// Node) and start-up stays fast; the outbox loads node:fs in durable mode only.

import {
  KEEPALIVE_MS,
  createRequests,
  decodeLine,
  encodeLine,
  exitIfNodeTooOld,
  helloFrame,
  readStdin,
  reserveStdout,
  routeFrame,
} from "./frames.mjs";
import { DEFAULT_MAX_OUTPUT_TOKENS, runToolLoop } from "./loop.mjs";
import { openOutbox } from "./outbox.mjs";
import { normalizeTools } from "./tool_specs.mjs";
import { errText, finiteOrUndefined, intAtLeast, isObject, toText } from "./values.mjs";

// ---------------------------------------------------------------------------
// Process-wide state

var outbox = null; // durable outbox, when WMO_LIVE_OUTBOX is set
var outputDead = false; // stdout failed; in durable mode frames still go to disk
var lastIn = 0; // durable mode: last inbound transport_in_seq dispatched
var session = null; // set by session_start; one per process

var stdout = process.stdout;
var stderr = process.stderr;

// Writes one line of diagnostics to stderr and, in durable mode, appends it
// to the outbox's stderr.log.
function writeDiag(text) {
  var line = text.endsWith("\n") ? text : text + "\n";
  try {
    stderr.write(line);
  } catch (e) {
    // stderr is gone; the log file below may still work
  }
  if (outbox !== null) {
    try {
      outbox.appendLog(line);
    } catch (e) {
      // nothing useful left to do
    }
  }
}

function diag(message) {
  writeDiag("wmo-e2b live runner: " + message);
}

var writeStdout = reserveStdout(writeDiag);

var DEFAULT_TURN_CAP = 60;
// The host answers a request with this when it interrupted the turn itself
// (an llm_response error, or a tool_response content with is_error).
var HOST_INTERRUPT_MARKER = "interrupted";

// ---------------------------------------------------------------------------
// Output

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

// Commits the frame to the outbox, then writes its envelope to stdout. A frame
// that cannot be committed cannot be delivered reliably: exit 1.
function publish(frame) {
  var seq = outbox.nextSeq();
  var json;
  try {
    json = outbox.commit(frame);
  } catch (e) {
    diag("durable outbox write failed for frame " + seq + " (" + frame.type + "): " + errText(e) + "; exiting");
    process.exit(1);
  }
  writeLine(json);
}

// Keepalives are never enveloped or persisted.
function sendKeepalive() {
  writeLine('{"type":"transport_keepalive"}');
}

function sendEpisodeError(note) {
  send({ type: "episode_error", note: note });
}

// ---------------------------------------------------------------------------
// Input

function handleLine(line) {
  var value = decodeLine(line, diag);
  if (value === undefined) return;
  if (outbox === null) {
    if (value !== null) routeFrame(value, HANDLERS, diag);
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
  routeFrame(value.frame, HANDLERS, diag);
  send({ type: "transport_ack", transport_in_seq: n });
}

// Live-session frames name no session or turn (one session per process, and
// req_ids are unique within it), so a reply is matched by req_id and kind only.
var requests = createRequests(send, diag, null);

var HANDLERS = {
  llm_response: requests.resolveReply,
  tool_response: requests.resolveReply,
  session_start: onSessionStart,
  user_message: onUserMessage,
  abort: onAbort,
  ping: function (frame) {
    send({ type: "pong", nonce: frame.nonce === undefined ? null : frame.nonce });
  },
  shutdown: function () {
    process.exit(0);
  },
};

// Sends a request frame for `turn`; resolves to the reply frame, or to null
// when the turn is aborted or ended first (then nothing more is sent).
function request(turn, type, fields) {
  if (stopped(turn)) return Promise.resolve(null);
  return requests.request(turn, type, fields);
}

function interruptPending(turn) {
  requests.settleOwner(turn, function (entry) {
    entry.resolve(null);
  });
}

function stopped(turn) {
  return turn.aborted || turn.ended;
}

// ---------------------------------------------------------------------------
// Session and turns

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
    temperature: finiteOrUndefined(frame.temperature),
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
  if (turn === null || stopped(turn)) return; // idle: nothing to abort
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

// Whether a reply is the host's own interrupt of the turn (it aborted it
// before its abort frame arrived).
function hostInterrupted(reply) {
  if (reply.type === "llm_response") return reply.error === HOST_INTERRUPT_MARKER;
  return reply.is_error === true && reply.content === HOST_INTERRUPT_MARKER;
}

// Runs the turn on the shared loop (the session is its transcript and limits);
// returns the turn's end reason. Sends episode_error itself for a failed model call.
async function turnLoop(s, turn) {
  var out = await runToolLoop(s, turn, {
    callModel: function (body) {
      return request(turn, "llm_request", { openai_body: body });
    },
    callTool: function (name, args) {
      return request(turn, "tool_request", { name: name, arguments: args });
    },
    // The host may abort a turn at any time: by an abort frame, or by
    // answering a pending request with its interrupt marker.
    cutOff: function () {
      return stopped(turn);
    },
    interrupted: hostInterrupted,
    // A user_message during a turn is a steer: it reaches the model before the
    // turn's next model call.
    takeUserInput: function () {
      var texts = turn.steers.map(function (st) {
        return st.text;
      });
      turn.steers = [];
      return texts;
    },
    hasUserInput: function () {
      return turn.steers.length > 0;
    },
    // Protocol §2: submit is a tool the host answers (it keeps the answer); the
    // turn completes once it has.
    submitOnHost: true,
  });
  if (out.end === "submit") return "completed";
  if (out.end === "turn_cap") return "turn_limit";
  if (out.end === "no_action") return "no_tool_call";
  if (out.end === "model_failed") {
    sendEpisodeError("model call failed: " + out.note);
    return "error";
  }
  return "aborted";
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
  exitIfNodeTooOld("wmo-e2b live runner");
  var outboxDir = typeof process.env.WMO_LIVE_OUTBOX === "string" ? process.env.WMO_LIVE_OUTBOX.trim() : "";
  if (outboxDir !== "") {
    var opened = await openOutbox(outboxDir);
    outbox = opened.outbox;
    if (opened.problem !== null) {
      diag("cannot start the durable outbox: " + opened.problem);
      process.exit(3);
    }
  }

  stdout.on("error", onOutputFailure);
  readStdin(handleLine, function (err) {
    diag("stdin failed: " + errText(err));
    process.exit(0);
  });

  var keepalive = setInterval(sendKeepalive, KEEPALIVE_MS);
  if (typeof keepalive.unref === "function") keepalive.unref();

  send(helloFrame({ mode: "session", transport: outbox === null ? "stdio" : "durable" }));
}

main().catch(function (e) {
  diag("start-up failed: " + toText(e));
  process.exit(3);
});
