// wmo-e2b pi harness: runs the real pi agent loop (`runAgentLoop` from
// @mariozechner/pi-agent-core) inside the runner, with every model call and
// every tool call answered by the host over the runner's frames.
//
// runner.mjs imports this module lazily, at the first episode_start that names
// `"harness": "pi"`, then calls `load(bundleFile)` once and `runEpisode(...)`
// for every pi episode. pi comes from one file, the bundle named by
// WMO_PI_BUNDLE (runner/pi/entry.mjs and what it imports, built on the host by
// runner/pi/build.mjs; the runner checked its digest before hello): one module
// to read and link instead of the ~700 files of a node_modules tree.
//
// The model bridge is pi's `streamFn` hook: no HTTP server, no provider SDK, no
// credential (pi is handed a dummy key that nothing reads). Our stream function
// turns pi's context into an OpenAI chat-completions body, sends it as an
// `llm_request`, and replays the host's completion as pi's assistant-message
// event stream.
//
// Episode semantics match the builtin loop (loop.mjs, whose helpers this module
// shares): the turn cap, the nudges after a reply without a tool call, the stop
// reasons, and `done.turns` = model calls. Nothing per episode accumulates at module level
// (only the last episode's tool list is kept, to reuse its compiled schemas).

import { pathToFileURL } from "node:url";

import {
  MAX_NONACTION_TURNS,
  firstChoice,
  malformedNote,
  messageText,
  nonActionReason,
  nudgeFor,
  parseArguments,
  unparsedWarnings,
} from "./loop.mjs";
import { normalizeTools } from "./tool_specs.mjs";
import { answerText } from "./values.mjs";

// The bundle's exports, once loaded: { runAgentLoop, createAssistantMessageEventStream }.
var pi = null;

// Tool-call argument objects that stand in for arguments the model sent as
// invalid JSON, mapped to the message the tool result should carry. Weak, so
// nothing outlives the episode that produced it.
var badArguments = new WeakMap();
// Tool-call blocks whose arguments the model sent as a JSON string, mapped to
// that string, so it is echoed back byte for byte.
var rawArguments = new WeakMap();

// The last episode's tool definitions, reused when the next episode carries the
// same list: pi compiles a validator per schema object, and keeping one list
// (not one per episode) lets it reuse that work. Bounded: one entry.
var toolCache = { key: null, schemas: null };

var SUBMITTED_NOTE = "Not run: the final answer was already submitted.";

// Imports the pi bundle (a file path). Safe to call again; it loads once.
export async function load(bundleFile) {
  if (pi !== null) return pi;
  if (typeof bundleFile !== "string" || bundleFile === "") {
    throw new Error("the pi harness is not enabled: WMO_PI_BUNDLE is not set");
  }
  var mod = await import(pathToFileURL(bundleFile).href);
  for (var name of ["runAgentLoop", "createAssistantMessageEventStream"]) {
    if (typeof mod[name] !== "function") throw new Error("the pi bundle " + bundleFile + " has no " + name + " export");
  }
  pi = mod;
  return pi;
}

// ---------------------------------------------------------------------------
// pi context -> OpenAI chat-completions body

function blocksText(content) {
  if (typeof content === "string") return content;
  var out = "";
  if (Array.isArray(content)) {
    for (var i = 0; i < content.length; i++) {
      var b = content[i];
      if (b && b.type === "text" && typeof b.text === "string") out += b.text;
    }
  }
  return out;
}

function userContent(content) {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  var parts = [];
  var onlyText = true;
  for (var i = 0; i < content.length; i++) {
    var b = content[i];
    if (!b) continue;
    if (b.type === "text") parts.push({ type: "text", text: b.text });
    else if (b.type === "image") {
      onlyText = false;
      parts.push({ type: "image_url", image_url: { url: "data:" + b.mimeType + ";base64," + b.data } });
    }
  }
  return onlyText ? blocksText(content) : parts;
}

function assistantEntry(m) {
  var text = null;
  var calls = [];
  for (var i = 0; i < m.content.length; i++) {
    var b = m.content[i];
    if (b.type === "text") text = (text === null ? "" : text) + b.text;
    else if (b.type === "toolCall") {
      var raw = rawArguments.get(b);
      calls.push({
        id: b.id,
        type: "function",
        function: { name: b.name, arguments: raw !== undefined ? raw : JSON.stringify(b.arguments) },
      });
    }
  }
  if (calls.length > 0) return { role: "assistant", content: text, tool_calls: calls };
  return { role: "assistant", content: text === null ? "" : text };
}

function buildBody(ep, context, options) {
  var messages = [{ role: "system", content: typeof context.systemPrompt === "string" ? context.systemPrompt : "" }];
  var list = context.messages;
  for (var i = 0; i < list.length; i++) {
    var m = list[i];
    if (m.role === "user") messages.push({ role: "user", content: userContent(m.content) });
    else if (m.role === "assistant") {
      // a failed reply ends the episode, so it is never sent back
      if (m.stopReason === "error" || m.stopReason === "aborted") continue;
      messages.push(assistantEntry(m));
    } else if (m.role === "toolResult") {
      messages.push({ role: "tool", tool_call_id: m.toolCallId, content: blocksText(m.content) });
    }
  }
  var tools = [];
  var defined = context.tools || [];
  for (var j = 0; j < defined.length; j++) {
    var t = defined[j];
    var original = ep.toolDefs.get(t.name);
    tools.push(
      original !== undefined
        ? original
        : { type: "function", function: { name: t.name, description: t.description, parameters: t.parameters } }
    );
  }
  var body = { messages: messages, tools: tools, max_tokens: options && typeof options.maxTokens === "number" ? options.maxTokens : ep.start.maxOutputTokens };
  if (options && typeof options.temperature === "number") body.temperature = options.temperature;
  return body;
}

// ---------------------------------------------------------------------------
// host completion -> pi assistant-message events

function emptyUsage() {
  return { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0, cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 } };
}

function num(v) {
  return typeof v === "number" && Number.isFinite(v) ? v : 0;
}

function usageOf(u) {
  var usage = emptyUsage();
  if (!u || typeof u !== "object") return usage;
  var cached = u.prompt_tokens_details && typeof u.prompt_tokens_details === "object" ? num(u.prompt_tokens_details.cached_tokens) : 0;
  usage.input = Math.max(0, num(u.prompt_tokens) - cached);
  usage.cacheRead = cached;
  usage.output = num(u.completion_tokens);
  usage.totalTokens = num(u.total_tokens) || usage.input + usage.cacheRead + usage.output;
  return usage;
}

function newAssistantMessage(model) {
  return {
    role: "assistant",
    content: [],
    api: model.api,
    provider: model.provider,
    model: model.id,
    usage: emptyUsage(),
    stopReason: "stop",
    timestamp: Date.now(),
  };
}

function failStream(stream, out, message) {
  out.stopReason = "error";
  out.errorMessage = message;
  stream.push({ type: "error", reason: "error", error: out });
}

function makeStreamFn(ep) {
  var kit = ep.kit;
  var episode = ep.episode;
  return async function wmoStream(model, context, options) {
    var stream = pi.createAssistantMessageEventStream();
    var out = newAssistantMessage(model);
    var reply;
    try {
      reply = await kit.request(episode, "llm_request", { openai_body: buildBody(ep, context, options) });
    } catch (e) {
      // the episode ended under us (or stdout failed): end pi's loop
      failStream(stream, out, String(e && e.message ? e.message : e));
      return stream;
    }
    episode.turns += 1;

    if (reply.error !== undefined && reply.error !== null) {
      ep.providerError = true;
      failStream(stream, out, answerText(reply.error));
      return stream;
    }
    var completion = reply.completion;
    var choice = firstChoice(completion);
    if (choice === null) {
      kit.diag("episode " + episode.id + ": " + malformedNote(reply));
      ep.providerError = true;
      failStream(stream, out, "the llm_response carried no completion.choices[0].message");
      return stream;
    }
    var message = choice.message;
    var text = messageText(message.content);
    if (text !== null && text.trim() !== "") ep.lastText = text.trim();
    var calls = Array.isArray(message.tool_calls) ? message.tool_calls : [];
    var truncated = choice.finish_reason === "length";
    ep.lastWarnings = unparsedWarnings(choice);
    ep.lastTruncated = truncated;
    if (typeof completion.id === "string") out.responseId = completion.id;
    if (typeof completion.model === "string") out.responseModel = completion.model;
    out.usage = usageOf(completion.usage);

    stream.push({ type: "start", partial: out });
    if (text !== null) {
      var textIndex = out.content.length;
      var block = { type: "text", text: "" };
      out.content.push(block);
      stream.push({ type: "text_start", contentIndex: textIndex, partial: out });
      block.text = text;
      stream.push({ type: "text_delta", contentIndex: textIndex, delta: text, partial: out });
      stream.push({ type: "text_end", contentIndex: textIndex, content: text, partial: out });
    }
    // A truncated reply's tool calls are not run (they may be cut off) and are
    // not echoed back, as in the builtin harness.
    if (!truncated) {
      for (var i = 0; i < calls.length; i++) {
        var call = calls[i] || {};
        var fn = call.function && typeof call.function === "object" ? call.function : {};
        var name = typeof fn.name === "string" ? fn.name : "";
        var parsed = parseArguments(fn.arguments);
        var args;
        if (parsed.ok) args = parsed.value;
        else {
          args = {};
          badArguments.set(args, "could not parse the arguments of " + name + " as JSON: " + parsed.message);
        }
        var toolCall = {
          type: "toolCall",
          id: typeof call.id === "string" && call.id !== "" ? call.id : "call_" + episode.turns + "_" + i,
          name: name,
          arguments: args,
        };
        if (typeof fn.arguments === "string") rawArguments.set(toolCall, fn.arguments);
        var index = out.content.length;
        out.content.push(toolCall);
        stream.push({ type: "toolcall_start", contentIndex: index, partial: out });
        if (typeof fn.arguments === "string") {
          stream.push({ type: "toolcall_delta", contentIndex: index, delta: fn.arguments, partial: out });
        }
        stream.push({ type: "toolcall_end", contentIndex: index, toolCall: toolCall, partial: out });
      }
    }
    out.stopReason = truncated ? "length" : out.content.some(isToolCall) ? "toolUse" : "stop";
    stream.push({ type: "done", reason: out.stopReason, message: out });
    return stream;
  };
}

function isToolCall(b) {
  return b.type === "toolCall";
}

// ---------------------------------------------------------------------------
// Tools

// Throws the parse failure recorded for arguments the model sent as bad JSON;
// pi turns the throw into an error tool result, and nothing is executed.
function prepareArguments(args) {
  var why = badArguments.get(args);
  if (why !== undefined) throw new Error(why);
  return args;
}

var DEFAULT_SUBMIT = {
  type: "function",
  function: {
    name: "submit",
    description: "Submit the final answer and finish the task.",
    parameters: { type: "object", properties: { answer: { type: "string" } }, required: ["answer"] },
  },
};

// Tool specs may come flat ({name, description, parameters}) or in OpenAI's
// shape; normalizeTools makes them all OpenAI's and throws (ending the
// episode with episode_error) for any other shape, so no tool is dropped.
function toolSchemas(defs) {
  var key;
  try {
    key = JSON.stringify(defs);
  } catch (e) {
    key = null;
  }
  if (key !== null && key === toolCache.key) return toolCache.schemas;
  var normalized = normalizeTools(defs);
  var schemas = [];
  var seen = new Set();
  for (var i = 0; i < normalized.length; i++) {
    var d = normalized[i];
    var fn = d.function;
    if (seen.has(fn.name)) continue;
    seen.add(fn.name);
    var params = fn.parameters && typeof fn.parameters === "object" ? fn.parameters : { type: "object", properties: {} };
    schemas.push({ def: d, name: fn.name, description: typeof fn.description === "string" ? fn.description : "", parameters: params });
  }
  if (!seen.has("submit")) {
    var f = DEFAULT_SUBMIT.function;
    schemas.push({ def: DEFAULT_SUBMIT, name: f.name, description: f.description, parameters: f.parameters });
  }
  if (key !== null) toolCache = { key: key, schemas: schemas };
  return schemas;
}

function makeTools(ep, schemas) {
  var kit = ep.kit;
  var episode = ep.episode;
  var tools = [];
  for (var i = 0; i < schemas.length; i++) {
    var s = schemas[i];
    ep.toolDefs.set(s.name, s.def);
    tools.push({
      name: s.name,
      label: s.name,
      description: s.description,
      parameters: s.parameters,
      prepareArguments: prepareArguments,
      execute: s.name === "submit" ? submitExecute(ep) : hostExecute(kit, episode, s.name),
    });
  }
  return tools;
}

function submitExecute(ep) {
  return async function (toolCallId, params) {
    ep.submitted = true;
    ep.answer = answerText(params ? params.answer : undefined);
    return { content: [{ type: "text", text: "Answer submitted." }], details: {} };
  };
}

function hostExecute(kit, episode, name) {
  return async function (toolCallId, params) {
    var reply = await kit.request(episode, "tool_request", { name: name, arguments: params === undefined || params === null ? {} : params });
    var content = typeof reply.content === "string" ? reply.content : answerText(reply.content);
    if (reply.is_error === true) throw new Error(content);
    return { content: [{ type: "text", text: content }], details: {} };
  };
}

// ---------------------------------------------------------------------------
// Episode

function noEmit() {}

function llmMessages(messages) {
  return messages.filter(function (m) {
    return m.role === "user" || m.role === "assistant" || m.role === "toolResult";
  });
}

// Runs one episode. `episode` is the runner's episode object (id, turns,
// ended, start{instruction, system, tools, maxTurns, maxOutputTokens,
// temperature}); `kit` holds what the runner lends: request, sendDone, diag.
// Ends the episode with a done frame; throws for an episode_error.
export async function runEpisode(episode, kit) {
  if (pi === null) throw new Error("the pi harness was not loaded");
  var s = episode.start;
  var ep = {
    episode: episode,
    kit: kit,
    start: s,
    toolDefs: new Map(),
    lastText: "",
    lastWarnings: [],
    lastTruncated: false,
    providerError: false,
    submitted: false,
    answer: "",
    hitTurnCap: false,
    nonAction: 0,
    finalReason: null,
  };
  var tools = makeTools(ep, toolSchemas(s.tools));
  var model = {
    id: "wmo-host",
    name: "wmo-host",
    api: "openai-completions",
    provider: "wmo-host",
    baseUrl: "",
    reasoning: false,
    input: ["text"],
    cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 },
    contextWindow: 128000,
    maxTokens: s.maxOutputTokens,
  };
  var config = {
    model: model,
    apiKey: "no-key-in-sandbox",
    getApiKey: function () {
      return "no-key-in-sandbox";
    },
    maxTokens: s.maxOutputTokens,
    temperature: s.temperature,
    maxRetries: 0,
    toolExecution: "sequential",
    convertToLlm: llmMessages,
    beforeToolCall: async function () {
      if (ep.submitted || episode.ended) return { block: true, reason: SUBMITTED_NOTE };
      return undefined;
    },
    shouldStopAfterTurn: function (turn) {
      if (ep.submitted || episode.ended) return true;
      if (turn.message.content.some(isToolCall)) {
        ep.nonAction = 0;
        if (episode.turns >= s.maxTurns) {
          ep.hitTurnCap = true;
          return true;
        }
      }
      return false;
    },
    // Called when pi would stop because the reply had no tool call: nudge, or
    // settle the stop reason and let the loop end.
    getFollowUpMessages: async function () {
      if (ep.submitted || episode.ended) return [];
      var warnings = ep.lastWarnings;
      var reason = nonActionReason(warnings, ep.lastTruncated);
      ep.nonAction += 1;
      if (ep.nonAction < MAX_NONACTION_TURNS && episode.turns < s.maxTurns) {
        return [{ role: "user", content: nudgeFor(reason, s.maxOutputTokens, warnings), timestamp: Date.now() }];
      }
      ep.finalReason = reason;
      return [];
    },
  };
  var context = { systemPrompt: s.system, messages: [], tools: tools };
  var prompt = { role: "user", content: s.instruction, timestamp: Date.now() };

  var produced = await pi.runAgentLoop([prompt], context, config, noEmit, undefined, makeStreamFn(ep));
  if (episode.ended) return;

  var last = null;
  for (var i = produced.length - 1; i >= 0; i--) {
    if (produced[i].role === "assistant") {
      last = produced[i];
      break;
    }
  }
  var reason;
  if (ep.submitted) {
    await kit.sendDone(episode, "submit", ep.answer);
    return;
  }
  if (ep.providerError) reason = "provider_error";
  else if (last !== null && (last.stopReason === "error" || last.stopReason === "aborted")) {
    kit.diag("episode " + episode.id + ": pi ended with an error: " + (last.errorMessage || last.stopReason));
    reason = "provider_error";
  } else if (ep.hitTurnCap) reason = "max_turns";
  else if (ep.finalReason !== null) reason = ep.finalReason;
  else reason = "no_tool_call";
  await kit.sendDone(episode, reason, ep.lastText);
}
