"""The official OpenAI and Anthropic Python SDKs against the runner's model endpoint.

Run as the agent of a task (`eval --harness cmd:...`, see endpoint_sdk_check.sh): it reads
the endpoint from the variables every agent gets and calls each API as the SDKs do, plain
and streamed. The SDKs parse what the endpoint sends into their own typed objects (a stream
through their accumulators, which refuse events out of order); the checks below compare
what they built with what the scripted model said. Exits 0 when every check passed.

The task's model_script (written by the shell script) answers, in order:
  1-6: a tool call `run` with {"command": "ls -l"} and the text "looking";
  7:   the turn budget is spent (max_turns 6): each API's limit answer.
"""

import json
import os
import sys

import anthropic
import openai

failures = []
passed = 0


def check(name, cond, detail=""):
    global passed
    if cond:
        passed += 1
    else:
        failures.append("%s: %s" % (name, detail))


TOOL_ARGS = {"command": "ls -l"}
oa = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
an = anthropic.Anthropic(base_url=os.environ["ANTHROPIC_BASE_URL"], api_key=os.environ["ANTHROPIC_API_KEY"], max_retries=0)
run_tool_openai = {"type": "function", "function": {"name": "run", "description": "run a command",
                                                      "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}
run_tool_responses = {"type": "function", "name": "run", "description": "run a command",
                      "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}
run_tool_anthropic = {"name": "run", "description": "run a command",
                      "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}


def check_chat(name, completion):
    msg = completion.choices[0].message
    check(name + " finish_reason", completion.choices[0].finish_reason == "tool_calls", completion.choices[0].finish_reason)
    check(name + " text", msg.content == "looking", repr(msg.content))
    call = msg.tool_calls[0] if msg.tool_calls else None
    check(name + " tool call", call is not None and call.function.name == "run", repr(call))
    check(name + " arguments", call is not None and json.loads(call.function.arguments) == TOOL_ARGS, repr(call))
    check(name + " usage", completion.usage is not None and completion.usage.prompt_tokens > 0, repr(completion.usage))


# 1: chat completions, plain
c = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], tools=[run_tool_openai])
check_chat("chat", c)

# 2: chat completions, streamed through the SDK's accumulator
with oa.chat.completions.stream(model="m", messages=[{"role": "user", "content": "hi"}], tools=[run_tool_openai],
                                stream_options={"include_usage": True}) as s:
    c = s.get_final_completion()
check_chat("chat stream", c)

# 3: Responses, plain
r = oa.responses.create(model="m", input="hi", tools=[run_tool_responses])
calls = [o for o in r.output if o.type == "function_call"]
check("responses status", r.status == "completed", r.status)
check("responses text", r.output_text == "looking", repr(r.output_text))
check("responses call", len(calls) == 1 and calls[0].name == "run" and json.loads(calls[0].arguments) == TOOL_ARGS, repr(calls))
check("responses usage", r.usage is not None and r.usage.input_tokens > 0, repr(r.usage))

# 4: Responses, streamed
with oa.responses.stream(model="m", input="hi", tools=[run_tool_responses]) as s:
    kinds = [e.type for e in s]
    r = s.get_final_response()
check("responses stream order", kinds[0] == "response.created" and kinds[-1] == "response.completed", repr(kinds))
check("responses stream text", r.output_text == "looking", repr(r.output_text))
calls = [o for o in r.output if o.type == "function_call"]
check("responses stream call", len(calls) == 1 and json.loads(calls[0].arguments) == TOOL_ARGS, repr(calls))

# 5: Anthropic Messages, plain
m = an.messages.create(model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}], tools=[run_tool_anthropic])
check("messages stop_reason", m.stop_reason == "tool_use", m.stop_reason)
check("messages text", m.content[0].type == "text" and m.content[0].text == "looking", repr(m.content))
uses = [b for b in m.content if b.type == "tool_use"]
check("messages tool_use", len(uses) == 1 and uses[0].name == "run" and uses[0].input == TOOL_ARGS, repr(uses))
check("messages usage", m.usage.input_tokens > 0 and m.usage.output_tokens > 0, repr(m.usage))

# 6: Anthropic Messages, streamed through the SDK's accumulator
with an.messages.stream(model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}], tools=[run_tool_anthropic]) as s:
    kinds = [e.type for e in s]
    m = s.get_final_message()
check("messages stream order", kinds[0] == "message_start" and "message_stop" in kinds, repr(kinds))
check("messages stream stop_reason", m.stop_reason == "tool_use", m.stop_reason)
uses = [b for b in m.content if b.type == "tool_use"]
check("messages stream tool_use", len(uses) == 1 and uses[0].input == TOOL_ARGS, repr(uses))

# 7: past the budget, each API's own limit answer, typed by the SDKs
try:
    oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    check("chat past budget", False, "answered")
except openai.RateLimitError as e:
    check("chat past budget", e.code == "insufficient_quota", repr(e.code))
try:
    an.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    check("messages past budget", False, "answered")
except anthropic.BadRequestError as e:
    check("messages past budget", e.body["error"]["type"] == "invalid_request_error", repr(e.body))
try:
    oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], timeout=5, extra_headers={"Authorization": "Bearer wrong"})
    check("wrong key", False, "answered")
except openai.AuthenticationError:
    check("wrong key", True)

print("SDK-CHECK passed %d, failed %d" % (passed, len(failures)))
for f in failures:
    print("FAILED " + f)
sys.exit(1 if failures else 0)
