//! Benchmark helper for `project snapshot` on an E2B-compatible endpoint (normally
//! `wmo-e2b emulator`). The project is created with `wmo-e2b project create NAME --backend
//! e2b`; this fills it and times the harvest in process. `scripts/bench/e2b/sdk_bench.py
//! harvest` does the same harvest with the official SDK (`files.list(depth)` + `files.read`
//! per file) and prints the same tree hash. `scripts/bench/e2b/run.sh` runs both.
//!
//! ```text
//! E2B_API_KEY=.. E2B_API_URL=.. E2B_SANDBOX_URL=.. WMO_E2B_HOME=DIR \
//!   cargo run --release --example bench_e2b_snapshot -- populate --name NAME \
//!       [--dir tree] [--files 1000] [--bytes 8000000]
//!   cargo run --release --example bench_e2b_snapshot -- snapshot --name NAME [--dir tree] \
//!       [--reps 3] [--breakdown]
//! ```
//!
//! `populate`: writes FILES text files of BYTES/FILES bytes each under the project path DIR,
//! ten directories of ten subdirectories of FILES/100 files (one `node` command in the
//! sandbox), and prints the sandbox id and the sandbox path of DIR.
//! `snapshot`: opens the project as the CLI does (`LeasedBackend` over `E2bBackend`) and
//! times `Project::snapshot(DIR, TreeBounds::default())` REPS times; with `--breakdown`, then
//! where the time goes: how long the sandbox takes to start `node` with nothing to do, how
//! long the walker itself takes with its output thrown away, how long the same number of
//! stdout bytes as the walker's JSON takes to arrive (`head -c N
//! /dev/zero`, same `max_output`), how long the host takes to parse and decode that JSON in
//! memory, and, for comparison, a `tar` of DIR fetched with one binary `/files` read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::json;
use wmo_e2b::project::Project;
use wmo_e2b::sandbox::e2b::{E2bBackend, E2bOptions};
use wmo_e2b::sandbox::leased::LeasedBackend;
use wmo_e2b::sandbox::ledger::Ledger;
use wmo_e2b::sandbox::RunOpts;
use wmo_e2b::tree::TreeBounds;

mod bench_common;
use bench_common::arg;

fn open(name: &str) -> Result<Project, String> {
    let state = wmo_e2b::state::state_dir();
    let inner = E2bBackend::from_env(E2bOptions::default()).map_err(|e| e.to_string())?;
    let ledger = Ledger::open(&state, &format!("project:{name}")).map_err(|e| e.to_string())?;
    let backend = Arc::new(LeasedBackend::new(inner, ledger, "project"));
    Project::open(&state, name, backend).map_err(|e| format!("open {name}: {e}"))
}

const FILL: &str = r#"
const fs = require("fs");
const [dir, files, bytes] = process.argv.slice(1).map((v, i) => i ? +v : v);
const each = Math.floor(bytes / files), per = Math.ceil(files / 100);
let n = 0, total = 0;
for (let d = 0; d < 10 && n < files; d++)
  for (let s = 0; s < 10 && n < files; s++) {
    const sub = `${dir}/mod_${d}/sub_${s}`;
    fs.mkdirSync(sub, { recursive: true });
    for (let f = 0; f < per && n < files; f++, n++) {
      let text = "";
      for (let line = 0; text.length < each; line++)
        text += `// file ${n} line ${line}: the quick brown fox jumps over the lazy dog ${(n * 7919 + line) % 1000}\n`;
      text = text.slice(0, each);
      fs.writeFileSync(`${sub}/file_${f}.rs`, text);
      total += Buffer.byteLength(text);
    }
  }
process.stdout.write(JSON.stringify({ files: n, bytes: total }));
"#;

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The snapshot walker's JavaScript, cut out of `src/project/snapshot.rs`.
fn walker_source() -> Result<String, String> {
    const SRC: &str = include_str!("../src/project/snapshot.rs");
    let start = SRC
        .find("const WALKER: &str = r#\"")
        .ok_or("no WALKER in src/project/snapshot.rs")?;
    let body = &SRC[start + "const WALKER: &str = r#\"".len()..];
    let end = body.find("\"#;").ok_or("WALKER is not terminated")?;
    Ok(body[..end].to_string())
}

fn populate(args: &[String]) -> Result<(), String> {
    let name = arg(args, "--name", "");
    let dir = arg(args, "--dir", "tree");
    let files: u64 = arg(args, "--files", "1000").parse().expect("--files");
    let bytes: u64 = arg(args, "--bytes", "8000000").parse().expect("--bytes");
    let p = open(&name)?;
    let cmd = format!("node -e {} {} {files} {bytes}", quote(FILL), quote(&dir));
    let out = p
        .exec(&cmd, Duration::from_secs(120))
        .map_err(|e| format!("populate: {e}"))?;
    if out.exit_code != Some(0) {
        return Err(format!(
            "populate exited {:?}: {}",
            out.exit_code, out.output
        ));
    }
    let made: serde_json::Value = serde_json::from_str(out.output.trim())
        .map_err(|e| format!("populate said {:?}: {e}", out.output))?;
    println!(
        "{}",
        json!({"bench": "populate", "sandbox_id": p.state().sandbox_id,
               "path": format!("{}/{dir}", p.workspace()), "made": made})
    );
    Ok(())
}

fn snapshot(args: &[String]) -> Result<(), String> {
    let name = arg(args, "--name", "");
    let dir = arg(args, "--dir", "tree");
    let reps: usize = arg(args, "--reps", "3").parse().expect("--reps");
    let p = open(&name)?;
    for rep in 0..reps {
        let start = Instant::now();
        let snap = p
            .snapshot(&dir, TreeBounds::default())
            .map_err(|e| format!("snapshot: {e}"))?;
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{}",
            json!({"client": "ours", "bench": "snapshot", "rep": rep, "files": snap.files.len(),
                   "bytes": snap.total_bytes(), "seconds": secs, "tree_hash": snap.tree_hash()})
        );
        if rep + 1 == reps && args.iter().any(|a| a == "--breakdown") {
            breakdown(&p, &dir, &snap.files)?;
        }
    }
    Ok(())
}

#[derive(serde::Serialize, serde::Deserialize)]
struct WalkFile {
    path: String,
    content_base64: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct WalkOutput {
    files: Vec<WalkFile>,
    rejected: Vec<serde_json::Value>,
}

/// Where a snapshot's time goes, measured piece by piece (best of three each).
fn breakdown(
    p: &Project,
    dir: &str,
    files: &std::collections::BTreeMap<String, String>,
) -> Result<(), String> {
    let best = |f: &dyn Fn() -> Result<(), String>| -> Result<f64, String> {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            f()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best)
    };
    // The walker's output, byte for byte (JSON.stringify and serde_json agree on this shape).
    let walk = WalkOutput {
        files: files
            .iter()
            .map(|(path, c)| WalkFile {
                path: path.clone(),
                content_base64: STANDARD.encode(c),
            })
            .collect(),
        rejected: Vec::new(),
    };
    let json = serde_json::to_vec(&walk).map_err(|e| e.to_string())?;
    let b = TreeBounds::default();
    // The same output room `Project::snapshot` gives its walker.
    let room = (b.max_bytes as usize) * 4 / 3 + b.max_files * (b.max_path + 64) + 4096;
    let opts = RunOpts {
        timeout: Duration::from_secs(120),
        max_output: room * 2,
        ..RunOpts::default()
    };
    let sbx = p.sandbox();
    let run = |cmd: &str| -> Result<(), String> {
        let out = sbx.run(cmd, &opts).map_err(|e| format!("{cmd}: {e}"))?;
        match out.exit_code {
            Some(0) => Ok(()),
            code => Err(format!("{cmd}: exit {code:?}")),
        }
    };
    let node = best(&|| run("node -e ''"))?;
    let transport = best(&|| run(&format!("head -c {} /dev/zero", json.len())))?;
    let parse = best(&|| {
        let w: WalkOutput = serde_json::from_slice(&json).map_err(|e| e.to_string())?;
        for f in w.files {
            let bytes = STANDARD
                .decode(&f.content_base64)
                .map_err(|e| e.to_string())?;
            String::from_utf8(bytes).map_err(|e| e.to_string())?;
        }
        Ok(())
    })?;
    let trivial = best(&|| run("true"))?;
    // The walker itself, output thrown away: its text is taken from the source, so this
    // never drifts from what `Project::snapshot` runs.
    let walker = walker_source()?;
    let walk_only = best(&|| {
        run(&format!(
            "node -e {} {}/{dir} {} {} {} >/dev/null",
            quote(&walker),
            wmo_e2b::project::WORKSPACE_DIR,
            b.max_files,
            b.max_bytes,
            b.max_path
        ))
    })?;
    // An alternative transport for comparison: one tar in the sandbox, fetched in one
    // binary `/files` read (no base64, no JSON).
    // Commands name home-relative paths (commands run in the home, whose real path may
    // differ from the E2B path the file API takes).
    let ws = wmo_e2b::project::WORKSPACE_DIR;
    let tar_rel = format!("{ws}/.bench-snapshot.tar");
    let tar_abs = format!("{}/{tar_rel}", sbx.home().trim_end_matches('/'));
    let tar_read = best(&|| {
        run(&format!("tar -cf {tar_rel} -C {ws} {dir}"))?;
        sbx.read_file(&tar_abs).map(drop).map_err(|e| e.to_string())
    })?;
    let _ = run(&format!("rm -f {tar_rel}"));
    println!(
        "{}",
        json!({"client": "ours", "bench": "snapshot-breakdown", "walker_json_bytes": json.len(),
               "run_true_s": trivial, "node_startup_s": node, "stdout_transport_s": transport,
               "host_parse_decode_s": parse, "walker_to_devnull_s": walk_only,
               "tar_then_files_read_s": tar_read})
    );
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("populate") => populate(&args),
        Some("snapshot") => snapshot(&args),
        _ => Err("usage: bench_e2b_snapshot populate|snapshot --name NAME [options]".into()),
    };
    if let Err(e) = result {
        eprintln!("bench_e2b_snapshot: {e}");
        std::process::exit(1);
    }
}
