//! What several integration test files share: a scratch state directory with the CLI pointed
//! at it, the eval helpers around it, waits, and local sandboxes; in submodules, an
//! in-process emulator with a client of it, and the contamination tasks.
//!
//! Every test crate that declares `mod support;` uses its own subset: dead code is allowed.

#![allow(dead_code)]

pub mod attacks;
pub mod contamination;
pub mod e2b_cli;
pub mod emulator;
pub mod local;
pub mod project;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use serde_json::Value;
use wmo_e2b::analysis::Report;
use wmo_e2b::sandbox::local::LocalBackend;
use wmo_e2b::sandbox::{Backend, CreateSpec, Process, ProcessEvent, Sandbox, SpawnOpts};

/// A scratch directory for the CLI: its state (`WMO_E2B_HOME`) is `state/`, an eval writes to
/// `out/`, and every command runs in the directory itself.
pub struct Env {
    pub dir: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Env {
        Env {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn home(&self) -> PathBuf {
        self.path("state")
    }

    pub fn out(&self) -> PathBuf {
        self.path("out")
    }

    /// The CLI with `args`, on this state.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_wmo-e2b"));
        c.args(args)
            .env("WMO_E2B_HOME", self.home())
            .current_dir(self.dir.path());
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// Writes tasks-file lines to `tasks.jsonl` and returns its path.
    pub fn write_tasks(&self, lines: &[String]) -> PathBuf {
        let p = self.path("tasks.jsonl");
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        p
    }

    /// `eval` of `tasks` into `out/`, with `extra` options.
    pub fn eval_cmd(&self, tasks: &Path, extra: &[&str]) -> Command {
        let mut c = self.cmd(&["eval", "--tasks"]);
        c.arg(tasks).arg("--out").arg(self.out()).args(extra);
        c
    }

    pub fn eval(&self, tasks: &Path, extra: &[&str]) -> Output {
        self.eval_cmd(tasks, extra).output().unwrap()
    }

    /// Starts an eval in the background; its output goes nowhere.
    pub fn spawn_eval(&self, tasks: &Path, extra: &[&str]) -> Child {
        self.eval_cmd(tasks, extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// What `out/results.jsonl` holds so far.
    pub fn results(&self) -> Vec<Value> {
        results_in(&self.out())
    }

    pub fn result(&self, id: &str) -> Value {
        self.results()
            .into_iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("no result for {id}"))
    }

    /// Sandboxes the local backend still holds: their directories in the state.
    pub fn live_sandboxes(&self) -> Vec<String> {
        std::fs::read_dir(self.home().join("sandboxes"))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// What `sandbox list --json` says runs.
    pub fn sandbox_list(&self) -> Vec<Value> {
        let o = self.run(&["sandbox", "list", "--json"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    /// The directory of a live sandbox whose workspace holds `name`: the host sees what a
    /// confined sandbox writes only through the state directory.
    pub fn sandbox_with(&self, name: &str) -> Option<PathBuf> {
        std::fs::read_dir(self.home().join("sandboxes"))
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|d| d.join("root/workspace").join(name).exists())
    }
}

/// The results an eval wrote to `out` so far, each line whole.
pub fn results_in(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("results.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("torn result {l:?}: {e}")))
        .collect()
}

/// The report of a `reap --json` that succeeded.
/// The result of task `id` among `results`; fails the test naming what is there if none.
pub fn result_in<'a>(results: &'a [Value], id: &str) -> &'a Value {
    results
        .iter()
        .find(|r| r["id"] == id)
        .unwrap_or_else(|| panic!("no result for {id}: {results:?}"))
}

pub fn reap_report(o: &Output) -> Value {
    assert_eq!(o.status.code(), Some(0), "{}", text(o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// How many sandboxes a reap report says it killed.
pub fn killed_by(report: &Value) -> usize {
    report["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["result"] == "killed")
        .count()
}

/// `n` tasks (`t000`, `t001`, ...) whose model waits `delay_ms` before a bash call, then
/// submits: sandboxes stay busy for a while, and every task passes.
pub fn slow_tasks(n: usize, delay_ms: u64) -> Vec<String> {
    (0..n)
        .map(|i| {
            format!(
                r#"{{"id": "t{i:03}", "instruction": "x", "model_script": [{{"delay_ms": {delay_ms}, "tool_calls": [{{"name": "bash", "arguments": {{"command": "true"}}}}]}}, {{"tool_calls": [{{"name": "submit", "arguments": {{"answer": "ok"}}}}]}}]}}"#
            )
        })
        .collect()
}

/// A command's exit status and output, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Sends `signal` to `child` (the process only, not its group).
pub fn signal(child: &Child, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: kill(2) has no memory effects; the pid is our own child's.
    unsafe { libc::kill(pid, signal) };
}

/// Polls `cond` every 20 ms until it holds (true) or `within` has passed (false).
pub fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `cond` holds; fails the test, naming `what`, once `within` has passed.
pub fn wait_for(what: &str, within: Duration, cond: impl FnMut() -> bool) {
    assert!(eventually(within, cond), "timed out waiting for {what}");
}

/// Every pid `/proc` lists now (none when it cannot be read).
pub fn proc_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .collect()
}

/// Whether this test runs as root; when not, says on stderr why the caller skips (`why`).
pub fn is_root(why: &str) -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    let root = unsafe { libc::geteuid() == 0 };
    if !root {
        eprintln!("not root: {why}");
    }
    root
}

/// Whether a host process is alive, zombies excluded.
pub fn pid_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        !matches!(state, Some('Z' | 'X') | None)
    })
}

/// The session `pid` belongs to, as this process's PID namespace numbers it.
pub fn session_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    // State, ppid, process group, session.
    rest.split_whitespace().nth(3)?.parse().ok()
}

/// A local backend on `state` and a sandbox of it that lives two minutes at most.
pub fn local_sandbox(state: &Path) -> (Arc<LocalBackend>, Arc<dyn Sandbox>) {
    let backend = LocalBackend::open(state).unwrap();
    let sandbox = backend
        .create(&CreateSpec {
            timeout_secs: 120,
            ..CreateSpec::default()
        })
        .unwrap();
    (backend, sandbox)
}

/// Starts `cmd` in `sandbox` with its stdin open to `send_stdin`.
pub fn spawn_with_stdin(sandbox: &dyn Sandbox, cmd: &str) -> Process {
    let opts = SpawnOpts {
        stdin: true,
        ..SpawnOpts::default()
    };
    sandbox.spawn(cmd, &opts).unwrap()
}

/// Reads a process's events until its stdout holds `needle`, and returns that stdout. Fails
/// the test on any other event first (an exit, a failure), or once `within` has passed.
pub fn read_until(events: &Receiver<ProcessEvent>, needle: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    while !String::from_utf8_lossy(&out).contains(needle) {
        match events.recv_deadline(deadline) {
            Ok(ProcessEvent::Stdout(d)) => out.extend(d),
            Ok(ProcessEvent::Stderr(_)) => {}
            Ok(other) => panic!(
                "{other:?} before {needle:?}; stdout so far {:?}",
                String::from_utf8_lossy(&out)
            ),
            Err(e) => panic!(
                "no {needle:?} ({e}); stdout so far {:?}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A tasks-file line: `id`, an instruction, and `extra` fields (JSON text, may be empty).
pub fn task(id: &str, extra: &str) -> String {
    let body = if extra.is_empty() {
        String::new()
    } else {
        format!(", {extra}")
    };
    format!(r#"{{"id": "{id}", "instruction": "do {id}"{body}}}"#)
}

/// A model_script step that submits `ok`.
pub const SUBMIT: &str = r#"{"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]}"#;

/// Waits for `child` to exit; kills it and fails past `limit` (a bound on a hang, not on
/// speed).
pub fn wait_bounded(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("eval did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The frames of a task's transcript in the eval's out directory.
pub fn transcript_frames(env: &Env, id: &str) -> Vec<Value> {
    std::fs::read_to_string(env.out().join(format!("transcripts/{id}.jsonl")))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l.get("frame").is_some())
        .map(|l| l["frame"].clone())
        .collect()
}

/// Shares one pi install (the bundle of the real npm packages) between tests: built once
/// under `target/pi-cache`, linked into the test's state dir.
pub fn share_pi_install(env: &Env) {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/pi-cache");
    wmo_e2b::runner::pi::ensure_installed(&cache)
        .expect("bundling the pi packages (needs the npm registry once)");
    std::fs::create_dir_all(env.home()).unwrap();
    std::os::unix::fs::symlink(cache.join("npm"), env.home().join("npm")).unwrap();
}

/// SIGKILLs the runner of a sandbox behind the tool's back: its process group, found in the
/// sandbox's process records.
pub fn kill_runner(sandbox: &Path) {
    for rec in std::fs::read_dir(sandbox.join("procs")).unwrap().flatten() {
        let text = std::fs::read_to_string(rec.path()).unwrap_or_default();
        if text.contains("runner.mjs") {
            let pid = rec.file_name().to_string_lossy().into_owned();
            let _ = Command::new("kill")
                .args(["-9", "--", &format!("-{pid}")])
                .status();
        }
    }
}

/// `wmo-e2b report` with `args`.
pub fn report(env: &Env, args: &[&str]) -> Output {
    let mut c = env.cmd(&["report"]);
    c.args(args);
    c.output().unwrap()
}

/// `report --json` parsed into the library's `Report`; it must serialize back to the very
/// document printed.
pub fn report_json(env: &Env, args: &[&str]) -> Report {
    let mut all = args.to_vec();
    all.push("--json");
    let o = report(env, &all);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let printed: Value = serde_json::from_slice(&o.stdout).unwrap();
    let parsed: Report = serde_json::from_value(printed.clone()).unwrap();
    assert_eq!(serde_json::to_value(&parsed).unwrap(), printed);
    parsed
}
