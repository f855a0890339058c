// What the runner's user-harness path does to its heap: every episode it writes the harness
// files into a fresh ep-<id>/ directory and imports agent.mjs with a fresh `?ep=<id>` URL, so
// agent.mjs (and every module it imports relatively) is a new ES module each episode, and Node
// never frees a module record. This imports a module N times with the same URL and with a
// unique URL each time, forcing GC, and prints the heap left per import, for a tiny module and
// for a ~120 KB one (harness-sized).
//   node --expose-gc scripts/bench/esm_import_leak.mjs [N]
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const n = Number(process.argv[2] || 200);
const dir = mkdtempSync(join(tmpdir(), "esm-leak-"));
const modules = {
  tiny: 'export async function runEpisode(ctx) { return "x".repeat(10); }\n',
  "120kb": Array.from({ length: 1500 }, (_, i) =>
    `export function f${i}(x) { return x + ${i} + "abcdefghijklmnopqrstuvwxyz".length; }\n`).join(""),
};
const out = { node: process.version, imports: n };
for (const [name, src] of Object.entries(modules)) {
  writeFileSync(join(dir, `${name}.mjs`), src);
  const url = pathToFileURL(join(dir, `${name}.mjs`)).href;
  out[`${name}_module_bytes`] = src.length;
  for (const mode of ["same_url", "unique_url"]) {
    globalThis.gc && gc();
    const before = process.memoryUsage();
    for (let i = 0; i < n; i++) {
      await import(mode === "same_url" ? url : `${url}?${mode}=${i}`);
    }
    globalThis.gc && gc();
    const after = process.memoryUsage();
    out[`${name}_${mode}_heap_kib_per_import`] = (after.heapUsed - before.heapUsed) / 1024 / n;
    out[`${name}_${mode}_rss_kib_per_import`] = (after.rss - before.rss) / 1024 / n;
  }
}
rmSync(dir, { recursive: true, force: true });
console.log(JSON.stringify(out));
