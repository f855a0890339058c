// The tool specs a start frame carries (episode_start, session_start), in the
// one shape every harness uses.

import { isObject, preview } from "./values.mjs";

// Tool specs arrive in two shapes: the reference runtime's flat
// {name, description, parameters}, and OpenAI's {type: "function", function:
// {...}}. Both become OpenAI's, the shape a chat-completions body needs (a
// flat spec also carrying type "function", as OpenAI's Responses API writes
// it, is flat too). Anything else throws, naming the spec: an agent must not
// run without a tool it was given.
export function normalizeTools(list) {
  if (list === undefined || list === null) return [];
  if (!Array.isArray(list)) throw new Error("tools is not a list of tool specs: " + preview(list));
  var out = [];
  for (var i = 0; i < list.length; i++) {
    var spec = list[i];
    var fn = null;
    var why = null;
    if (!isObject(spec)) why = "it is not an object";
    else if (spec.type !== undefined && spec.type !== "function") why = "its type is " + preview(spec.type) + ', not "function"';
    else if (spec.function !== undefined) {
      if (isObject(spec.function)) fn = spec.function;
      else why = "its function is not an object";
    } else {
      fn = {};
      for (var k in spec) if (k !== "type") fn[k] = spec[k];
    }
    if (why === null) why = functionProblem(fn);
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

// What is wrong with a spec's {name, description, parameters}, or null.
function functionProblem(fn) {
  if (typeof fn.name !== "string" || fn.name === "") return "it has no name";
  if (fn.description !== undefined && fn.description !== null && typeof fn.description !== "string") {
    return "its description is not a string";
  }
  if (fn.parameters !== undefined && fn.parameters !== null && !isObject(fn.parameters)) {
    return "its parameters are not a JSON schema object";
  }
  return null;
}
