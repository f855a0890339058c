//! Project turns through the library: a turn survives a dropped output stream without
//! replaying work, and a dead runner is replaced and the turn replayed from the mirror.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use wmo_e2b::cancel::CancelToken;
use wmo_e2b::project::session::{run_turn, TurnError, TurnOptions, TurnResult};
use wmo_e2b::project::{OnIdle, Project};
use wmo_e2b::provider::scripted::FixedScript;
use wmo_e2b::provider::{Completion, ModelCall, Provider, ProviderError};
use wmo_e2b::sandbox::local::LocalBackend;
use wmo_e2b::sandbox::{
    Backend, CreateSpec, ErrorClass, Killed, Metadata, Output, OutputSink, PauseKind, Paused,
    Process, ProcessEvent, ProcessInfo, Result, RunOpts, Sandbox, SandboxError, SandboxSummary,
    SpawnOpts,
};
use wmo_e2b::task::ScriptStep;

/// A local backend whose live runners lose their output stream after `cut_after` chunks:
/// the process lives on, only the host's view of its stdout is gone (as when an E2B stream
/// drops).
struct CutBackend {
    inner: Arc<LocalBackend>,
    cut_after: usize,
}

struct CutSandbox {
    inner: Arc<dyn Sandbox>,
    cut_after: usize,
}

impl Backend for CutBackend {
    fn name(&self) -> &'static str {
        "local"
    }
    fn create(&self, spec: &CreateSpec) -> Result<Arc<dyn Sandbox>> {
        Ok(Arc::new(CutSandbox {
            inner: self.inner.create(spec)?,
            cut_after: self.cut_after,
        }))
    }
    fn connect(&self, id: &str) -> Result<Arc<dyn Sandbox>> {
        Ok(Arc::new(CutSandbox {
            inner: self.inner.connect(id)?,
            cut_after: self.cut_after,
        }))
    }
    fn list(&self, filter: &Metadata) -> Result<Vec<SandboxSummary>> {
        self.inner.list(filter)
    }
    fn describe(&self, id: &str) -> Result<SandboxSummary> {
        self.inner.describe(id)
    }
    fn kill(&self, id: &str) -> Result<Killed> {
        self.inner.kill(id)
    }
    fn pause(&self, id: &str, kind: PauseKind) -> Result<Paused> {
        self.inner.pause(id, kind)
    }
}

impl Sandbox for CutSandbox {
    fn id(&self) -> &str {
        self.inner.id()
    }
    fn home(&self) -> &str {
        self.inner.home()
    }
    fn system_dir(&self) -> &str {
        self.inner.system_dir()
    }
    fn seal(&self) -> Result<()> {
        self.inner.seal()
    }
    fn reset(&self) -> Result<()> {
        self.inner.reset()
    }
    fn stop_agent(&self, runner_too: bool) -> Result<()> {
        self.inner.stop_agent(runner_too)
    }
    fn run(&self, cmd: &str, opts: &RunOpts) -> Result<Output> {
        self.inner.run(cmd, opts)
    }
    fn spawn_into(&self, cmd: &str, opts: &SpawnOpts, sink: Box<dyn OutputSink>) -> Result<u32> {
        self.inner.spawn_into(cmd, opts, sink)
    }
    fn spawn(&self, cmd: &str, opts: &SpawnOpts) -> Result<Process> {
        let p = self.inner.spawn(cmd, opts)?;
        if !cmd.contains("live.mjs") {
            return Ok(p);
        }
        let (tx, rx) = crossbeam_channel::unbounded();
        let cut_after = self.cut_after;
        std::thread::spawn(move || {
            let mut seen = 0;
            let mut cut = false;
            for ev in p.events.iter() {
                if cut {
                    continue; // keep draining so the runner never blocks on a full pipe
                }
                if matches!(ev, ProcessEvent::Stdout(_)) {
                    seen += 1;
                }
                if seen > cut_after {
                    cut = true;
                    let _ = tx.send(ProcessEvent::Failed(SandboxError::Remote {
                        class: ErrorClass::Transport,
                        message: "stream reset by test".into(),
                        source: None,
                    }));
                    continue;
                }
                let _ = tx.send(ev);
            }
        });
        Ok(Process {
            pid: p.pid,
            events: rx,
        })
    }
    fn connect(&self, pid: u32) -> Result<Process> {
        self.inner.connect(pid)
    }
    fn send_stdin(&self, pid: u32, data: &[u8]) -> Result<()> {
        self.inner.send_stdin(pid, data)
    }
    fn close_stdin(&self, pid: u32) -> Result<()> {
        self.inner.close_stdin(pid)
    }
    fn processes(&self) -> Result<Vec<ProcessInfo>> {
        self.inner.processes()
    }
    fn kill_process(&self, pid: u32) -> Result<()> {
        self.inner.kill_process(pid)
    }
    fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        self.inner.read_file(path)
    }
    fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        self.inner.write_file(path, data)
    }
    fn set_timeout(&self, secs: u64) -> Result<()> {
        self.inner.set_timeout(secs)
    }
    fn set_internet(&self, allowed: bool) -> Result<()> {
        self.inner.set_internet(allowed)
    }
}

/// Counts model calls, and can run a hook before answering call `hook_at`.
struct Counting {
    script: FixedScript,
    calls: AtomicUsize,
    hook_at: usize,
    hook: Box<dyn Fn() + Send + Sync>,
}

impl Provider for Counting {
    fn complete(&self, call: &ModelCall<'_>) -> std::result::Result<Completion, ProviderError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n == self.hook_at {
            (self.hook)();
        }
        self.script.complete(call)
    }
}

fn steps(v: serde_json::Value) -> Vec<ScriptStep> {
    serde_json::from_value(v).unwrap()
}

/// A project named `p` with its state under `dir`.
fn project_on(dir: &Path, backend: Arc<dyn Backend>) -> Project {
    Project::create(
        dir,
        "p",
        backend,
        None,
        Duration::from_secs(600),
        OnIdle::Kill,
    )
    .unwrap()
}

/// One turn, uncancelled, its event log discarded.
fn turn(
    project: &mut Project,
    provider: &dyn Provider,
    opts: &TurnOptions,
) -> std::result::Result<TurnResult, TurnError> {
    run_turn(
        project,
        provider,
        opts,
        &CancelToken::new(),
        &mut std::io::sink(),
    )
}

fn write_then_submit() -> Vec<ScriptStep> {
    steps(json!([
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "A"}}]},
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "b.txt", "content": "B"}}]},
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]},
        {"tool_calls": [{"name": "submit", "arguments": {"answer": "done"}}]},
    ]))
}

#[test]
fn a_turn_survives_a_dropped_output_stream_without_replaying_work() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(CutBackend {
        inner: LocalBackend::open(dir.path()).unwrap(),
        cut_after: 5,
    });
    let mut project = project_on(dir.path(), backend);
    let provider = Counting {
        script: FixedScript(write_then_submit()),
        calls: AtomicUsize::new(0),
        hook_at: usize::MAX,
        hook: Box::new(|| {}),
    };
    let opts = TurnOptions {
        instruction: "write a and b".into(),
        ..TurnOptions::default()
    };
    let r = turn(&mut project, &provider, &opts).unwrap();
    assert_eq!(r.answer.as_deref(), Some("done"));
    assert!(r.stream_lost, "the stream was never cut");
    assert!(r.frames_from_disk > 0, "no frame came from the outbox");
    assert_eq!(r.attempts, 1);
    assert_eq!(
        provider.calls.load(Ordering::SeqCst),
        4,
        "work was replayed"
    );
    assert_eq!(project.get("b.txt").unwrap(), b"B");
}

/// Kills the live runner behind the host's back: its whole process group, as the host
/// numbers it, leaving the sandbox's own records as they were.
fn kill_live_runner(sandbox: &dyn Sandbox) {
    for p in sandbox.processes().unwrap() {
        if p.cmd.contains("live.mjs") {
            let _ = std::process::Command::new("kill")
                .args(["-9", "--", &format!("-{}", p.pid)])
                .status();
        }
    }
}

/// Writes a and b, then submits; its live runner is killed once, as the second model call
/// comes in.
fn killing_the_runner_at_the_second_call(sandbox: Arc<dyn Sandbox>) -> Counting {
    Counting {
        script: FixedScript(write_then_submit()),
        calls: AtomicUsize::new(0),
        hook_at: 1,
        hook: Box::new(move || kill_live_runner(sandbox.as_ref())),
    }
}

#[test]
fn a_dead_runner_is_replaced_and_the_turn_replayed_from_the_mirror() {
    let dir = tempfile::tempdir().unwrap();
    let backend = LocalBackend::open(dir.path()).unwrap();
    let mut project = project_on(dir.path(), backend);
    project.put("seed.txt", b"from the mirror").unwrap();
    let first = project.state().sandbox_id.clone();
    let provider = killing_the_runner_at_the_second_call(project.sandbox().clone());
    let opts = TurnOptions {
        instruction: "write a and b".into(),
        ..TurnOptions::default()
    };
    let r = turn(&mut project, &provider, &opts).unwrap();
    assert_eq!(r.answer.as_deref(), Some("done"));
    assert_eq!(r.attempts, 2);
    assert_ne!(
        project.state().sandbox_id,
        first,
        "the sandbox was not replaced"
    );
    assert_eq!(project.get("seed.txt").unwrap(), b"from the mirror");
    assert_eq!(project.get("b.txt").unwrap(), b"B");

    // With bash allowed, the same failure is not replayed: shell writes bypass the mirror.
    let provider = killing_the_runner_at_the_second_call(project.sandbox().clone());
    let opts = TurnOptions {
        instruction: "again".into(),
        allow_bash: true,
        ..TurnOptions::default()
    };
    let err = turn(&mut project, &provider, &opts).unwrap_err();
    assert!(matches!(err, TurnError::NotReplayable { .. }), "{err}");
    assert!(err.to_string().contains("--allow-bash"), "{err}");
}
