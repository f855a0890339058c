// Bundles the pinned pi packages into one ES module: the file every sandbox gets in place
// of a node_modules tree.
//
//   node build.mjs OUT
//
// Run on the host (src/runner/pi/build.rs), in a directory holding this file, entry.mjs
// and the node_modules that `npm ci` installed from package-lock.json beside them. Writes
// the bundle to OUT and prints one JSON line on stdout: the bundled packages and their
// versions, the stubbed provider modules and esbuild's version. Anything unexpected (a
// package outside BUNDLED, an import left outside the bundle) fails the build, exit 1.
//
// The output depends only on the inputs: the same lockfile, entry and options give the
// same bytes (esbuild writes paths relative to this directory, and no timestamps).

import { readFileSync } from "node:fs";
import { builtinModules } from "node:module";
import { join } from "node:path";

import * as esbuild from "esbuild";

// The packages the bundle may hold: pi's two, and what pi-ai loads when it is imported.
// A pi upgrade that needs another one fails here, so nothing grows unnoticed.
const BUNDLED = ["@mariozechner/pi-agent-core", "@mariozechner/pi-ai", "typebox", "partial-json"];

// pi-ai registers its providers at load but imports each one's module (and that module's
// SDK: openai, @anthropic-ai/sdk, @google/genai, ...) only when a model of that API first
// streams. The harness hands runAgentLoop its own streamFn, which sends every model call
// to the host, so no provider ever streams in a sandbox. Those lazy imports resolve to a
// stub that throws, which pi reports as a failed stream, rather than pulling every SDK in.
// (Two computed imports stay as they are: env-api-keys.js loads node:fs, node:os and
// node:path, which are builtins, and bedrock's provider is imported by a computed
// specifier only when a bedrock model streams.)
const LAZY_PROVIDERS = /[\\/]@mariozechner[\\/]pi-ai[\\/]dist[\\/]providers[\\/]register-builtins\.js$/;

function fail(message) {
  process.stderr.write("build.mjs: " + message + "\n");
  process.exit(1);
}

const stubbed = [];
const stubProviders = {
  name: "stub-lazy-providers",
  setup(build) {
    build.onResolve({ filter: /^\.\/[\w.-]+\.js$/ }, (args) => {
      if (args.kind !== "dynamic-import" || !LAZY_PROVIDERS.test(args.importer)) return undefined;
      stubbed.push(args.path);
      return { path: args.path, namespace: "pi-provider-stub" };
    });
    build.onLoad({ filter: /.*/, namespace: "pi-provider-stub" }, (args) => ({
      contents:
        "throw new Error(" +
        JSON.stringify(
          "pi-ai's provider module " + args.path + " is not in the wmo-e2b pi bundle: the pi harness sends every model call to the host"
        ) +
        ");\n",
      loader: "js",
    }));
  },
};

// The package an input path belongs to (the last node_modules segment names it).
function packageOf(input) {
  const parts = input.split("/");
  const at = parts.lastIndexOf("node_modules");
  if (at < 0 || at + 1 >= parts.length) return null;
  return parts[at + 1].startsWith("@") ? parts[at + 1] + "/" + parts[at + 2] : parts[at + 1];
}

function versionOf(name) {
  return JSON.parse(readFileSync(join("node_modules", name, "package.json"), "utf8")).version;
}

const out = process.argv[2];
if (typeof out !== "string" || out === "") fail("usage: node build.mjs OUT");

let versions;
try {
  versions = { "@mariozechner/pi-agent-core": versionOf("@mariozechner/pi-agent-core"), "@mariozechner/pi-ai": versionOf("@mariozechner/pi-ai") };
} catch (e) {
  fail("the pi packages are not installed here: " + e.message);
}

let result;
try {
  result = await esbuild.build({
    absWorkingDir: process.cwd(),
    entryPoints: ["entry.mjs"],
    outfile: out,
    bundle: true,
    format: "esm",
    // Node's builtins stay imports (platform "node" leaves them external); everything
    // else is in the file.
    platform: "node",
    target: "node20",
    // Not minified: a stack trace from pi should name pi's functions.
    minify: false,
    sourcemap: false,
    legalComments: "eof",
    banner: {
      js:
        "// wmo-e2b pi bundle: @mariozechner/pi-agent-core@" +
        versions["@mariozechner/pi-agent-core"] +
        " @mariozechner/pi-ai@" +
        versions["@mariozechner/pi-ai"] +
        ", bundled by esbuild " +
        esbuild.version,
    },
    metafile: true,
    plugins: [stubProviders],
    logLevel: "silent",
  });
} catch (e) {
  fail("esbuild failed: " + (e && e.message ? e.message : String(e)));
}

const builtins = new Set(builtinModules);
const isBuiltin = (p) => p.startsWith("node:") || builtins.has(p);
const outputs = Object.values(result.metafile.outputs);
const leftOut = outputs.flatMap((o) => o.imports).filter((i) => !(i.external && isBuiltin(i.path)));
if (leftOut.length > 0) fail("the bundle imports what it does not hold: " + leftOut.map((i) => i.path).join(", "));

const packages = {};
for (const input of Object.keys(result.metafile.inputs)) {
  const name = packageOf(input);
  if (name !== null && !(name in packages)) packages[name] = versionOf(name);
}
const extra = Object.keys(packages).filter((p) => !BUNDLED.includes(p));
if (extra.length > 0) fail("packages outside the bundle's list were pulled in: " + extra.join(", "));

const report = { bundle: out, versions, packages, stubbed: [...new Set(stubbed)].sort(), esbuild: esbuild.version };
process.stdout.write(JSON.stringify(report) + "\n");
