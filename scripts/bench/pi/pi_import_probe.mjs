// Times what the pi harness's first episode spends importing pi, piece by piece.
//   node scripts/bench/pi/pi_import_probe.mjs <node_modules dir of a pi install>
// e.g. target/pi-cache/npm/pi-0.73.1/node_modules. Prints one JSON line. Run it a few times
// with `env -u NODE_EXTRA_CA_CERTS` (as sandboxes see node); with Node >= 22,
// NODE_COMPILE_CACHE=<dir> shows what V8's code cache saves.
import { pathToFileURL } from "node:url";

const M = process.argv[2];
if (!M) throw new Error("usage: pi_import_probe.mjs <node_modules dir>");
const url = (p) => pathToFileURL(M + "/" + p).href;
const t0 = performance.now();
await import(url("typebox/build/index.mjs"));
const t1 = performance.now();
await import(url("@mariozechner/pi-ai/dist/index.js"));
const t2 = performance.now();
await import(url("@mariozechner/pi-agent-core/dist/index.js"));
const t3 = performance.now();
console.log(JSON.stringify({
  node: process.version,
  typebox_ms: +(t1 - t0).toFixed(1),
  pi_ai_rest_ms: +(t2 - t1).toFixed(1),
  pi_agent_core_ms: +(t3 - t2).toFixed(1),
  total_ms: +(t3 - t0).toFixed(1),
  rss_mib: +(process.memoryUsage().rss / 1048576).toFixed(1),
}));
