// Tool specs as start frames carry them (runner/tool_specs.mjs), for both
// runners: the two known shapes become OpenAI's, anything else is refused.

import { test } from "node:test";
import assert from "node:assert/strict";

import { normalizeTools } from "../tool_specs.mjs";
import { FLAT_TOOLS, TOOLS } from "./frames.test.mjs";

test("flat specs (the reference's shape) and OpenAI's both come out in OpenAI's shape", () => {
  assert.deepEqual(normalizeTools(FLAT_TOOLS), TOOLS);
  assert.deepEqual(normalizeTools(TOOLS), TOOLS);
  // mixed shapes, and a flat spec carrying type "function" (OpenAI's Responses API writes that)
  assert.deepEqual(normalizeTools([FLAT_TOOLS[0], TOOLS[1], { type: "function", ...FLAT_TOOLS[2] }, FLAT_TOOLS[3]]), TOOLS);
  assert.deepEqual(normalizeTools(undefined), []);
  assert.deepEqual(normalizeTools(null), []);
});

test("a spec of no known shape is refused, naming it", () => {
  const cases = [
    [[...TOOLS, { name: 5 }], /: tool spec 4 has an unknown shape \(it has no name\): \{"name":5\}; expected \{name, description, parameters\}/],
    [[{ type: "custom", name: "x" }], /tool spec 0 has an unknown shape \(its type is "custom", not "function"\)/],
    [[{ type: "function", function: "bash" }], /its function is not an object/],
    [[{ type: "function", function: { description: "nameless" } }], /it has no name/],
    [["bash"], /it is not an object/],
    [[{ name: "bash", parameters: [] }], /its parameters are not a JSON schema object/],
    [[{ name: "bash", description: 3 }], /its description is not a string/],
    [{ bash: {} }, /: tools is not a list of tool specs: \{"bash":\{\}\}$/],
  ];
  for (const [tools, re] of cases) {
    assert.throws(() => normalizeTools(tools), re, JSON.stringify(tools));
  }
});
