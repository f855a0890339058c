// The endpoint harness: the model APIs served on loopback to an agent the host
// runs, every request relayed as an llm_request and answered with what the host
// sent, the caller's key checked, bodies bounded.
import { test } from "node:test";
import assert from "node:assert/strict";

import { episodeStart, startRunner } from "./frames.test.mjs";

const TOKEN = "0123456789abcdef0123456789abcdef";

async function endpointEpisode(t, id) {
  const r = await startRunner(t);
  r.send(episodeStart(id, { harness: "endpoint", endpoint: { token: TOKEN, model: "m1" } }));
  const ready = await r.next("endpoint_ready");
  assert.equal(ready.episode_id, id);
  return { r, base: "http://127.0.0.1:" + ready.port };
}

function post(base, path, body, key = TOKEN, header = "authorization") {
  const headers = { "content-type": "application/json" };
  headers[header] = header === "authorization" ? "Bearer " + key : key;
  return fetch(base + path, { method: "POST", headers, body: typeof body === "string" ? body : JSON.stringify(body) });
}

test("an endpoint episode without a usable token is refused before it starts", async (t) => {
  const r = await startRunner(t);
  r.send(episodeStart("e0", { harness: "endpoint", endpoint: { token: "short" } }));
  const err = await r.next("episode_error");
  assert.match(err.note, /endpoint\.token/);
});

test("requests cross as llm_request frames and the host's answer is written as sent", async (t) => {
  const { r, base } = await endpointEpisode(t, "e1");
  const pending = post(base, "/v1/messages?beta=true", { model: "x", max_tokens: 5, messages: [] }, TOKEN, "x-api-key");
  const req = await r.next("llm_request");
  assert.equal(req.api, "anthropic_messages");
  assert.deepEqual(req.api_body, { model: "x", max_tokens: 5, messages: [] });
  const events = [
    { event: "message_start", data: '{"type":"message_start"}' },
    { event: "message_stop", data: '{"type":"message_stop"}' },
  ];
  r.send({ type: "llm_response", episode_id: "e1", req_id: req.req_id, api_reply: { status: 200, events } });
  const res = await pending;
  assert.equal(res.status, 200);
  assert.equal(res.headers.get("content-type"), "text/event-stream");
  assert.equal(
    await res.text(),
    'event: message_start\ndata: {"type":"message_start"}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n',
  );

  const json = post(base, "/v1/chat/completions", { model: "x", messages: [] });
  const req2 = await r.next("llm_request");
  assert.equal(req2.api, "openai_chat");
  r.send({ type: "llm_response", episode_id: "e1", req_id: req2.req_id, api_reply: { status: 429, body: { error: { code: "insufficient_quota" } } } });
  const res2 = await json;
  assert.equal(res2.status, 429);
  assert.deepEqual(await res2.json(), { error: { code: "insufficient_quota" } });

  r.send({ type: "episode_end", episode_id: "e1" });
  const done = await r.next("done");
  assert.equal(done.reason, "agent_exit");
  await assert.rejects(fetch(base + "/v1/models"));
});

test("a wrong key, a wrong path, a body that is not JSON and an oversized one never reach the host", async (t) => {
  const { r, base } = await endpointEpisode(t, "e2");
  const wrong = await post(base, "/v1/chat/completions", { model: "x", messages: [] }, "not-the-key");
  assert.equal(wrong.status, 401);
  assert.equal((await wrong.json()).error.type, "authentication_error");
  const anthropicWrong = await post(base, "/v1/messages", {}, "nope", "x-api-key");
  assert.equal((await anthropicWrong.json()).type, "error");
  const path = await post(base, "/v1/embeddings", { input: "x" });
  assert.equal(path.status, 404);
  const bad = await post(base, "/v1/responses", "{not json");
  assert.equal(bad.status, 400);
  const big = await post(base, "/v1/responses", '{"x":"' + "a".repeat(33 * 1024 * 1024) + '"}');
  assert.equal(big.status, 413);
  const models = await fetch(base + "/v1/models", { headers: { authorization: "Bearer " + TOKEN } });
  assert.equal(models.status, 200);
  assert.equal((await models.json()).data[0].id, "m1");
  // None of it was a frame: the next one the host sees is the episode's end.
  r.send({ type: "episode_end", episode_id: "e2" });
  await r.next("done");
});
