// How the runners look at and describe the JSON values that arrive in frames.
//
// Shared by runner.mjs, live.mjs and their modules. Like every module a runner
// imports before its Node version check, this one has no imports of node:
// builtins and uses nothing newer than that check can name.

export function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

// An integer field of a start frame, or `fallback` when it is absent, not an
// integer, or below `min`.
export function intAtLeast(value, min, fallback) {
  return typeof value === "number" && Number.isInteger(value) && value >= min ? value : fallback;
}

// A finite number field of a start frame, or undefined (then it is left out of
// the model call rather than sent as null).
export function finiteOrUndefined(value) {
  return typeof value === "number" && Number.isFinite(value) ? value : undefined;
}

// A value quoted in an error message: its JSON, cut to 120 characters.
export function preview(value) {
  var text;
  try {
    text = JSON.stringify(value);
  } catch (e) {
    text = String(value);
  }
  text = String(text);
  return text.length > 120 ? text.slice(0, 120) + "..." : text;
}

// The text of an answer, tool result or error the host or a harness gave as any
// JSON value: strings as they are, objects as JSON, nothing as "".
export function answerText(value) {
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

// One argument of a console call, or a thrown value, as diagnostic text.
export function toText(a) {
  if (typeof a === "string") return a;
  if (a instanceof Error) return a.stack || String(a);
  try {
    return JSON.stringify(a);
  } catch (e) {
    return String(a);
  }
}

// A thrown error in one line: its code (for system errors) and message.
export function errText(e) {
  if (e && e.code) return String(e.code) + (e.message ? " " + e.message : "");
  return String(e && e.message ? e.message : e);
}
