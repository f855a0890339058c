// The endpoint harness: a model-API endpoint for an agent the host runs itself.
//
// An off-the-shelf agent (Claude Code, Codex, mini-swe-agent, ...) runs as a
// process of the task, started by the host; it speaks the OpenAI or Anthropic
// HTTP API. This harness serves those APIs on a loopback port and turns every
// request into an llm_request frame: the host answers it with the run's
// provider (its key never enters the sandbox) and sends back the reply already
// shaped as the API the agent spoke, JSON or server-sent events. The runner
// translates nothing: it checks the caller's token, bounds the request and
// writes what the host sent.
//
// Frames: after episode_start it sends endpoint_ready {port}; each request is
// an llm_request {api, api_body}; the host ends the episode with episode_end
// (the agent's process ended, or the episode did), and the runner answers done
// with reason "agent_exit" once the server is closed.

import { isObject, preview } from "./values.mjs";

// The paths served, by the API their request speaks (query strings ignored).
var API_OF_PATH = {
  "/v1/chat/completions": "openai_chat",
  "/chat/completions": "openai_chat",
  "/v1/responses": "openai_responses",
  "/responses": "openai_responses",
  "/v1/messages": "anthropic_messages",
  "/messages": "anthropic_messages",
};
var MODEL_LIST_PATHS = { "/v1/models": true, "/models": true };
// A request body larger than this is refused (413) before it crosses to the host.
var MAX_BODY_BYTES = 32 * 1024 * 1024;
// Connections this endpoint keeps at once; an agent needs a handful.
var MAX_CONNECTIONS = 64;

// Runs one endpoint episode: resolves once the host has ended it.
export async function runEpisode(episode, kit) {
  var http = await import("node:http");
  var spec = episode.start.endpoint;
  var sockets = new Set();
  var server = http.createServer(function (req, res) {
    serve(req, res, episode, kit, spec).catch(function (e) {
      kit.diag("endpoint request failed: " + String(e));
      writeJson(res, 500, apiError(pathApi(req.url), "the endpoint failed: " + String(e)));
    });
  });
  server.maxConnections = MAX_CONNECTIONS;
  server.on("connection", function (socket) {
    sockets.add(socket);
    socket.on("close", function () {
      sockets.delete(socket);
    });
  });
  var ended = new Promise(function (resolve) {
    episode.endEndpoint = resolve;
  });
  await new Promise(function (resolve, reject) {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", resolve);
  });
  kit.send({ type: "endpoint_ready", episode_id: episode.id, port: server.address().port });
  await ended;
  server.close();
  sockets.forEach(function (s) {
    s.destroy();
  });
  return kit.sendDone(episode, "agent_exit", "");
}

function pathOf(url) {
  var q = typeof url === "string" ? url.indexOf("?") : -1;
  return q === -1 ? String(url) : url.slice(0, q);
}

function pathApi(url) {
  var api = API_OF_PATH[pathOf(url)];
  return api === undefined ? "openai_chat" : api;
}

// The caller's key, from the header its API puts it in.
function presentedKey(req) {
  var auth = req.headers["authorization"];
  if (typeof auth === "string" && auth.slice(0, 7).toLowerCase() === "bearer ") return auth.slice(7).trim();
  var key = req.headers["x-api-key"];
  return typeof key === "string" ? key.trim() : null;
}

async function serve(req, res, episode, kit, spec) {
  var path = pathOf(req.url);
  var api = API_OF_PATH[path];
  // Every process of the host's network can reach a loopback port when the sandbox
  // shares it: only the agent, given the episode's token, is answered.
  if (presentedKey(req) !== spec.token) {
    req.resume();
    return writeJson(res, 401, apiError(pathApi(req.url), "invalid api key", "authentication_error"));
  }
  if (req.method === "GET" && MODEL_LIST_PATHS[path]) {
    req.resume();
    return writeJson(res, 200, modelList(spec.model));
  }
  if (req.method !== "POST" || api === undefined) {
    req.resume();
    return writeJson(res, 404, apiError(pathApi(req.url), "this endpoint serves " + Object.keys(API_OF_PATH).join(", ") + ", not " + req.method + " " + preview(path), "not_found_error"));
  }
  var body = await readBody(req);
  if (body === null) {
    return writeJson(res, 413, apiError(api, "the request body is over " + MAX_BODY_BYTES + " bytes"));
  }
  var parsed;
  try {
    parsed = JSON.parse(body.toString("utf8"));
  } catch (e) {
    return writeJson(res, 400, apiError(api, "the request body is not JSON: " + e.message));
  }
  if (episode.ended) return writeJson(res, 503, apiError(api, "the episode has ended", "api_error"));
  var reply = await kit.request(episode, "llm_request", { api: api, api_body: parsed });
  var out = isObject(reply.api_reply) ? reply.api_reply : null;
  if (out === null) {
    var why = typeof reply.error === "string" ? reply.error : "the host sent no reply";
    return writeJson(res, 500, apiError(api, why, "api_error"));
  }
  var status = Number.isInteger(out.status) && out.status >= 200 && out.status < 600 ? out.status : 500;
  if (Array.isArray(out.events)) return writeEvents(res, status, out.events);
  return writeJson(res, status, out.body === undefined ? {} : out.body);
}

// The whole body, or null past MAX_BODY_BYTES.
function readBody(req) {
  return new Promise(function (resolve, reject) {
    var parts = [];
    var size = 0;
    var over = false;
    req.on("data", function (chunk) {
      if (over) return;
      size += chunk.length;
      if (size > MAX_BODY_BYTES) {
        over = true;
        parts = [];
        return;
      }
      parts.push(chunk);
    });
    req.on("end", function () {
      resolve(over ? null : Buffer.concat(parts));
    });
    req.on("error", reject);
  });
}

function writeJson(res, status, value) {
  if (res.headersSent) return res.end();
  var text = JSON.stringify(value);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

// Server-sent events as the APIs send them: an `event:` line where the API names
// its events, a `data:` line, a blank line.
function writeEvents(res, status, events) {
  res.writeHead(status, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" });
  var text = "";
  for (var i = 0; i < events.length; i++) {
    var e = events[i];
    if (!isObject(e) || typeof e.data !== "string") continue;
    if (typeof e.event === "string") text += "event: " + e.event + "\n";
    text += "data: " + e.data + "\n\n";
  }
  res.end(text);
}

// An error body in the shape of `api` (the host shapes every other answer).
function apiError(api, message, type) {
  if (api === "anthropic_messages") {
    return { type: "error", error: { type: type === undefined ? "invalid_request_error" : type, message: message } };
  }
  return { error: { message: message, type: type === undefined ? "invalid_request_error" : type, param: null, code: null } };
}

// The model list agents ask for at start-up: the run's one model, in both APIs'
// fields (OpenAI's `object`/`owned_by`, Anthropic's `type`/`display_name`).
function modelList(model) {
  var id = typeof model === "string" && model !== "" ? model : "default";
  var entry = { id: id, object: "model", created: 0, owned_by: "wmo-e2b", type: "model", display_name: id, created_at: "1970-01-01T00:00:00Z" };
  return { object: "list", data: [entry], has_more: false, first_id: id, last_id: id };
}
