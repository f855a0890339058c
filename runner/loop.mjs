// The builtin tool-calling agent loop, shared by runner.mjs (one eval episode)
// and live.mjs (one turn of a live session), and the helpers the pi harness
// shares with it (nudges, argument parsing, reading a completion).
//
// The loop asks the host for a model call, runs the tool calls of the reply
// one at a time, and ends on a submit, the turn cap, a failed model call, or
// too many replies in a row without a runnable tool call (each of which is
// first answered with a nudge). It returns how it ended; what that means on
// the wire is the caller's business.

import { answerText, isObject } from "./values.mjs";

// Replies in a row without a runnable tool call before the loop gives up.
export var MAX_NONACTION_TURNS = 3;
export var DEFAULT_MAX_OUTPUT_TOKENS = 4096;

var NUDGE_TAIL =
  "Continue the task: either call exactly one tool now, or call `submit` with your " +
  "final answer if the task is already complete. Do not reply with prose alone.";

// The text of a message's content: a string as it is, the text parts of a
// list joined, null for anything else.
export function messageText(content) {
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

// The user message that answers a reply without a runnable tool call.
export function nudgeFor(reason, maxOutputTokens, warnings) {
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

// A tool call's arguments (a JSON string, an object, or nothing) as
// {ok: true, value: object} or {ok: false, message}.
export function parseArguments(raw) {
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

// choices[0] of a completion when it carries a message object, else null.
export function firstChoice(completion) {
  var choice = isObject(completion) && Array.isArray(completion.choices) ? completion.choices[0] : undefined;
  return isObject(choice) && isObject(choice.message) ? choice : null;
}

// Why firstChoice found nothing usable in an llm_response.
export function malformedNote(reply) {
  return "llm_response " + reply.req_id + " carried no completion.choices[0].message";
}

// The host's tool-call parser's complaints about a reply (text that looked
// like a tool call but could not be read as one).
export function unparsedWarnings(choice) {
  return Array.isArray(choice.wmo_unparsed_tool_calls) ? choice.wmo_unparsed_tool_calls : [];
}

// Why a reply ran no tool: the stop reason it ends the loop with, and the
// nudge it gets until then.
export function nonActionReason(warnings, truncated) {
  if (warnings.length > 0) return "unparsed_tool_call";
  if (truncated) return "output_truncated";
  return "no_tool_call";
}

// Runs the loop over `conv` until it ends, and returns how:
//   {end: "submit", answer}     the model called submit
//   {end: "turn_cap", why}      conv.turnCap model calls were made; `why` is
//                               the last reply's non-action reason when it ran
//                               no tool, else null
//   {end: "no_action", why}     MAX_NONACTION_TURNS replies in a row ran no tool
//   {end: "model_failed", note, malformed}
//                               a model call failed (malformed: its completion
//                               held no message)
//   {end: "cut_off"}            the host stopped the run (live sessions only)
// Every outcome also carries lastText, the last non-blank reply text, trimmed.
//
// conv: {messages, tools, maxOutputTokens, temperature, turnCap}; `messages` is
//   the transcript, appended to in place; temperature undefined is left out.
// run: {turns}, the model calls answered so far; the loop counts each one.
// host: what the two runners do differently (each says why where it builds it):
//   callModel(body), callTool(name, args): promises of the reply frame, or of
//     null when the run was cut off while waiting
//   cutOff(): whether the run was stopped from outside
//   interrupted(reply): whether a reply is the host's own interrupt marker
//   takeUserInput(): texts of user messages that arrived during the run; they
//     join the transcript before the next model call
//   hasUserInput(): whether such messages are waiting
//   submitOnHost: true when submit is a tool call the host answers, false when
//     it ends the run here without reaching the host
export async function runToolLoop(conv, run, host) {
  var nonAction = 0;
  var lastText = "";
  var ending = function (outcome) {
    outcome.lastText = lastText;
    return outcome;
  };
  for (;;) {
    if (host.cutOff()) return ending({ end: "cut_off" });
    if (run.turns >= conv.turnCap) return ending({ end: "turn_cap", why: null });
    var input = host.takeUserInput();
    if (input.length > 0) {
      for (var q = 0; q < input.length; q++) conv.messages.push({ role: "user", content: input[q] });
      nonAction = 0; // fresh user input: the nudge budget starts over
    }
    var reply = await host.callModel(modelBody(conv));
    if (reply === null || host.cutOff() || host.interrupted(reply)) return ending({ end: "cut_off" });
    run.turns += 1; // every answered model call counts, a failed one too
    if (reply.error !== undefined && reply.error !== null) {
      return ending({ end: "model_failed", note: answerText(reply.error), malformed: false });
    }
    var choice = firstChoice(reply.completion);
    if (choice === null) return ending({ end: "model_failed", note: malformedNote(reply), malformed: true });
    var message = choice.message;
    var text = messageText(message.content);
    if (text !== null && text.trim() !== "") lastText = text.trim();
    var toolCalls = Array.isArray(message.tool_calls) ? message.tool_calls : [];
    var truncated = choice.finish_reason === "length";

    if (toolCalls.length > 0 && !truncated) {
      conv.messages.push({ role: "assistant", content: text, tool_calls: toolCalls });
      nonAction = 0;
      var ended = await runToolCalls(conv.messages, host, toolCalls);
      if (ended !== null) return ending(ended);
      continue;
    }

    // No action this turn. A truncated reply's tool calls are not run (they may
    // be cut off) and are not echoed back, so the transcript stays valid (no
    // tool_calls without matching tool messages, no assistant turn without content).
    conv.messages.push({ role: "assistant", content: text === null ? "" : text });
    var warnings = unparsedWarnings(choice);
    var why = nonActionReason(warnings, truncated);
    nonAction += 1;
    // User input that arrived meanwhile goes to the model instead of a nudge,
    // and the run does not end for lack of a tool call.
    var steered = host.hasUserInput();
    if (!steered && nonAction >= MAX_NONACTION_TURNS) return ending({ end: "no_action", why: why });
    if (run.turns >= conv.turnCap) return ending({ end: "turn_cap", why: why });
    if (steered) continue;
    conv.messages.push({ role: "user", content: nudgeFor(why, conv.maxOutputTokens, warnings) });
  }
}

function modelBody(conv) {
  var body = { messages: conv.messages, tools: conv.tools, max_tokens: conv.maxOutputTokens };
  if (conv.temperature !== undefined) body.temperature = conv.temperature;
  return body;
}

// Runs a reply's tool calls in order, one at a time; returns the outcome that
// ends the loop, or null to go on. Calls after a submit never run.
async function runToolCalls(messages, host, toolCalls) {
  for (var i = 0; i < toolCalls.length; i++) {
    var call = toolCalls[i] || {};
    var fn = isObject(call.function) ? call.function : {};
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
    var args = parsed.value;
    if (name === "submit") {
      args = { answer: answerText(args.answer) };
      if (!host.submitOnHost) return { end: "submit", answer: args.answer };
    }
    var result = await host.callTool(name, args);
    if (result === null || host.cutOff()) return { end: "cut_off" };
    messages.push({
      role: "tool",
      tool_call_id: callId,
      content: typeof result.content === "string" ? result.content : answerText(result.content),
    });
    if (host.interrupted(result)) return { end: "cut_off" };
    if (name === "submit") return { end: "submit", answer: args.answer };
  }
  return null;
}
