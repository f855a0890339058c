//! One E2B sandbox: processes over envd's `process.Process` service, files over `/files`,
//! lifetime and network over the control plane.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::api::Api;
use super::envd::version::CLOSE_STDIN;
use super::envd::{b64_encode, Envd, EventStream};
use super::error::{Code, EnvdFailure, Subject};
use super::process::{self, ReaderTicket, Readers};
use super::reuse;
use crate::sandbox::{
    EventSink, Output, OutputSink, Process, ProcessInfo, Result, Role, RunOpts, Sandbox,
    SandboxError, SpawnOpts,
};
use crate::sync::lock;

/// The home of E2B's default user, where templates keep user files.
pub const HOME: &str = "/home/user";
/// The runner's directory: owned by root, so task commands (run as `user`) cannot change it.
/// The template recipe bakes the pi bundle under it.
pub const SYSTEM_DIR: &str = "/opt/wmo-e2b";
/// The E2B users the two roles run as.
const TASK_USER: &str = "user";
const SYSTEM_USER: &str = "root";
/// Bound on the seal and reset scripts.
const REUSE_TIMEOUT: Duration = Duration::from_secs(120);

fn user_of(role: Role) -> &'static str {
    match role {
        Role::Task => TASK_USER,
        Role::System | Role::Verify => SYSTEM_USER,
    }
}

/// Files under the system directory and the tests are root's; everything else belongs to the
/// task user.
fn file_user(path: &str) -> &'static str {
    let under = |dir: &str| {
        path.strip_prefix(dir)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    if under(SYSTEM_DIR) || under(crate::sandbox::TESTS_DIR) {
        SYSTEM_USER
    } else {
        TASK_USER
    }
}
/// Commands run as `bash -l -c CMD`, like the SDK's, so login profiles set PATH and friends.
const SHELL: &str = "/bin/bash";

/// A handle on an E2B sandbox. Dropping it does not kill the sandbox; `Backend::kill` does.
pub struct E2bSandbox {
    id: String,
    template: Option<String>,
    envd_version: Option<String>,
    envd: Envd,
    api: Arc<Api>,
    readers: Arc<Readers>,
    /// Pids of the `Role::System` processes this handle started (the runner): a reset keeps
    /// them and their descendants.
    system_pids: Mutex<Vec<u32>>,
    /// The image's variables (see `E2bBackend::create_e2b`), beneath a verifier's own.
    image_env: Vec<(String, String)>,
}

impl E2bSandbox {
    pub(super) fn new(
        id: String,
        template: Option<String>,
        envd_version: Option<String>,
        envd: Envd,
        api: Arc<Api>,
        readers: Arc<Readers>,
        image_env: Vec<(String, String)>,
    ) -> E2bSandbox {
        E2bSandbox {
            image_env,
            id,
            template,
            envd_version,
            envd,
            api,
            readers,
            system_pids: Mutex::new(Vec::new()),
        }
    }

    /// The template id the create/connect answer named.
    pub fn template_id(&self) -> Option<&str> {
        self.template.as_deref()
    }

    pub fn envd_version(&self) -> Option<&str> {
        self.envd_version.as_deref()
    }

    /// Where this sandbox's envd is reached.
    pub fn envd_base(&self) -> &str {
        self.envd.base()
    }

    /// Whether envd answers; false when the edge reports the sandbox gone.
    pub fn health(&self) -> Result<bool> {
        self.envd
            .health()
            .map_err(|f| f.into_error(&self.id, "checking health", Subject::Sandbox))
    }

    /// Creates a directory and its missing parents; false when it already existed.
    pub fn make_dir(&self, path: &str) -> Result<bool> {
        check_path(path)?;
        match self
            .envd
            .unary("filesystem.Filesystem/MakeDir", &json!({ "path": path }))
        {
            Ok(_) => Ok(true),
            Err(f) if f.code() == Some(Code::AlreadyExists) => Ok(false),
            Err(f) => Err(f.into_error(
                &self.id,
                &format!("creating directory {path}"),
                Subject::Path(path),
            )),
        }
    }

    fn start_request(
        &self,
        cmd: &str,
        cwd: Option<&str>,
        envs: &[(String, String)],
        stdin: bool,
    ) -> Value {
        // Later entries win, as in a shell.
        let envs: BTreeMap<&str, &str> =
            envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut process = json!({
            "cmd": SHELL,
            "args": ["-l", "-c", cmd],
        });
        // As the SDK: without one, envd starts where the template says for the user.
        if let Some(cwd) = cwd {
            process["cwd"] = json!(cwd);
        }
        if !envs.is_empty() {
            process["envs"] = json!(envs);
        }
        json!({ "process": process, "stdin": stdin })
    }

    /// Opens a process stream and reads it up to the start event.
    fn open(
        &self,
        rpc: &str,
        request: &Value,
        lifetime: Option<Duration>,
        user: Option<&str>,
        what: &str,
        subject: Subject<'_>,
    ) -> Result<(u32, EventStream)> {
        let opened = self
            .envd
            .stream(rpc, request, lifetime, user)
            .and_then(|mut s| {
                let pid = process::await_start(&mut s)?;
                Ok((pid, s))
            });
        opened.map_err(|f| self.envd.confirm(f).into_error(&self.id, what, subject))
    }

    /// Hands a started stream to a reader thread that feeds `sink`.
    fn attach(&self, pid: u32, stream: EventStream, sink: Box<dyn OutputSink>) -> Result<()> {
        let ticket = ReaderTicket {
            envd: self.envd.clone(),
            sandbox_id: self.id.clone(),
            pid,
            readers: Arc::clone(&self.readers),
            generation: self.readers.claim(&self.id, pid),
        };
        process::start_reader(ticket, stream, sink).map_err(|e| SandboxError::Io {
            id: self.id.clone(),
            what: format!("starting the output reader of process {pid}"),
            source: e,
        })
    }

    /// Runs one of the reuse scripts as root; anything but exit 0 means not provably clean.
    fn reuse_script(&self, what: &str, script: &str, args: &[String]) -> Result<()> {
        self.reuse_script_as(Role::System, what, script, args)
    }

    fn reuse_script_as(&self, role: Role, what: &str, script: &str, args: &[String]) -> Result<()> {
        let mut cmd = format!("bash -c {} reuse", crate::sandbox::shell_quote(script));
        for a in args {
            cmd.push(' ');
            cmd.push_str(&crate::sandbox::shell_quote(a));
        }
        let out = self.run(
            &cmd,
            &RunOpts {
                cwd: Some("/".into()),
                role,
                timeout: REUSE_TIMEOUT,
                max_output: 4096,
                ..RunOpts::default()
            },
        )?;
        if out.exit_code == Some(0) {
            return Ok(());
        }
        Err(SandboxError::Unclean {
            id: self.id.clone(),
            reason: format!(
                "{what} failed ({}): {}{}",
                if out.timed_out {
                    "timed out".to_string()
                } else {
                    format!("exit {:?}", out.exit_code)
                },
                out.stdout.to_text().trim(),
                out.stderr.to_text().trim()
            ),
        })
    }

    fn process_call(&self, rpc: &str, pid: u32, request: Value, what: &str) -> Result<Value> {
        self.envd.unary(rpc, &request).map_err(|f| {
            f.into_error(
                &self.id,
                &format!("{what} of process {pid}"),
                Subject::Process(pid),
            )
        })
    }
}

impl Sandbox for E2bSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    fn home(&self) -> &str {
        HOME
    }

    fn system_dir(&self) -> &str {
        SYSTEM_DIR
    }

    fn seal(&self) -> Result<()> {
        self.reuse_script("sealing", &reuse::seal_script(), &[])
    }

    fn reset(&self) -> Result<()> {
        let pids: Vec<String> = lock(&self.system_pids).iter().map(u32::to_string).collect();
        self.reuse_script("resetting", &reuse::reset_script(), &pids)?;
        self.reuse_script_as(
            Role::Task,
            "resetting the task user's shared memory",
            &reuse::reset_user_script(),
            &[],
        )
    }

    fn stop_agent(&self, runner_too: bool) -> Result<()> {
        let pids: Vec<String> = if runner_too {
            Vec::new()
        } else {
            lock(&self.system_pids).iter().map(u32::to_string).collect()
        };
        self.reuse_script("stopping the agent", &reuse::stop_script(), &pids)
    }

    fn run(&self, cmd: &str, opts: &RunOpts) -> Result<Output> {
        let started = Instant::now();
        let verifier;
        let (cmd, envs) = match opts.role {
            Role::Verify => {
                let envs: Vec<(String, String)> =
                    self.image_env.iter().chain(&opts.envs).cloned().collect();
                verifier = reuse::verify_command(cmd, &envs);
                (verifier.as_str(), &[][..])
            }
            _ => (cmd, &opts.envs[..]),
        };
        let request = self.start_request(cmd, opts.cwd.as_deref(), envs, false);
        let (pid, mut stream) = self.open(
            "process.Process/Start",
            &request,
            Some(opts.timeout),
            Some(user_of(opts.role)),
            "starting a command",
            Subject::Sandbox,
        )?;
        let collected = process::collect(&mut stream, opts.max_output).map_err(|f| {
            self.envd
                .confirm(f)
                .into_error(&self.id, "running a command", Subject::Sandbox)
        })?;
        drop(stream);
        if collected.expired {
            // envd kills at its deadline; this covers our own bound firing first. A process
            // that is already gone is the expected answer.
            let _ = self.kill_process(pid);
        }
        let timed_out =
            collected.expired || (collected.exit.is_none() && started.elapsed() >= opts.timeout);
        Ok(Output {
            exit_code: if timed_out { None } else { collected.exit },
            stdout: collected.stdout,
            stderr: collected.stderr,
            timed_out,
        })
    }

    fn spawn_into(&self, cmd: &str, opts: &SpawnOpts, sink: Box<dyn OutputSink>) -> Result<u32> {
        let ended;
        let cmd = match opts.ends_after {
            Some(after) => {
                ended = under_timeout(cmd, after);
                ended.as_str()
            }
            None => cmd,
        };
        let request = self.start_request(cmd, opts.cwd.as_deref(), &opts.envs, opts.stdin);
        // No lifetime: envd would kill a long-lived runner when it passed.
        let (pid, stream) = self.open(
            "process.Process/Start",
            &request,
            None,
            Some(user_of(opts.role)),
            "starting a process",
            Subject::Sandbox,
        )?;
        if opts.role == Role::System {
            lock(&self.system_pids).push(pid);
        }
        self.attach(pid, stream, sink)?;
        Ok(pid)
    }

    fn connect(&self, pid: u32) -> Result<Process> {
        let (started, stream) = self.open(
            "process.Process/Connect",
            &json!({ "process": { "pid": pid } }),
            None,
            None,
            &format!("attaching to process {pid}"),
            Subject::Process(pid),
        )?;
        if started != pid {
            return Err(EnvdFailure::protocol(
                format!("attaching to process {pid} started a stream of process {started}"),
                None,
            )
            .into_error(&self.id, "attaching to a process", Subject::Process(pid)));
        }
        let (sink, events) = EventSink::new();
        self.attach(pid, stream, Box::new(sink))?;
        Ok(Process { pid, events })
    }

    fn send_stdin(&self, pid: u32, data: &[u8]) -> Result<()> {
        let request = json!({
            "process": { "pid": pid },
            "input": { "stdin": b64_encode(data) },
        });
        self.process_call(
            "process.Process/SendInput",
            pid,
            request,
            "writing to the stdin",
        )
        .map(drop)
    }

    fn close_stdin(&self, pid: u32) -> Result<()> {
        if !self.envd.supports(CLOSE_STDIN) {
            return Err(SandboxError::Unsupported(format!(
                "closing a stdin needs envd {CLOSE_STDIN} or newer; sandbox {} runs {}",
                self.id,
                self.envd_version.as_deref().unwrap_or("an unnamed version")
            )));
        }
        let request = json!({ "process": { "pid": pid } });
        self.process_call(
            "process.Process/CloseStdin",
            pid,
            request,
            "closing the stdin",
        )
        .map(drop)
    }

    fn processes(&self) -> Result<Vec<ProcessInfo>> {
        let answer = self
            .envd
            .unary_repeatable("process.Process/List", &json!({}))
            .map_err(|f| f.into_error(&self.id, "listing processes", Subject::Sandbox))?;
        Ok(process_list(&answer))
    }

    fn kill_process(&self, pid: u32) -> Result<()> {
        let request = json!({ "process": { "pid": pid }, "signal": "SIGNAL_SIGKILL" });
        self.process_call("process.Process/SendSignal", pid, request, "killing")
            .map(drop)
    }

    fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        check_path(path)?;
        self.envd
            .read_file(path, file_user(path))
            .map_err(|f| f.into_error(&self.id, &format!("reading {path}"), Subject::Path(path)))
    }

    fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        check_path(path)?;
        self.envd
            .write_file(path, data, file_user(path))
            .map_err(|f| f.into_error(&self.id, &format!("writing {path}"), Subject::Path(path)))
    }

    fn set_timeout(&self, secs: u64) -> Result<()> {
        self.api.set_timeout(&self.id, secs)
    }

    fn set_internet(&self, allowed: bool) -> Result<()> {
        self.api.set_network(&self.id, allowed)
    }
}

/// `{"processes": [{"pid": N, "config": {"cmd", "args"}}]}`; absent means none. A command we
/// started as `bash -l -c CMD` is reported as CMD.
fn process_list(answer: &Value) -> Vec<ProcessInfo> {
    let Some(list) = answer.get("processes").and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|p| {
            let pid = u32::try_from(p.get("pid")?.as_u64()?).ok()?;
            let config = p.get("config");
            let cmd = config
                .and_then(|c| c.get("cmd"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            let args: Vec<&str> = config
                .and_then(|c| c.get("args"))
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let cmd = match args.as_slice() {
                ["-l", "-c", inner] if cmd == SHELL => (*inner).to_string(),
                _ => std::iter::once(cmd)
                    .chain(args.iter().copied())
                    .collect::<Vec<_>>()
                    .join(" "),
            };
            Some(ProcessInfo { pid, cmd })
        })
        .collect()
}

fn check_path(path: &str) -> Result<()> {
    let bad = |reason| SandboxError::BadPath {
        path: path.to_string(),
        reason,
    };
    if !path.starts_with('/') {
        return Err(bad("sandbox paths must be absolute"));
    }
    if path.contains('\0') {
        return Err(bad("the path contains a NUL byte"));
    }
    Ok(())
}

/// `cmd` under coreutils `timeout`, which ends it as [`SpawnOpts::ends_after`] says from
/// inside the sandbox: envd signals only the process it started, never its group. `exec`
/// spares one process; the sandbox's shell is bash, or an image's `sh` where it has none.
fn under_timeout(cmd: &str, after: std::time::Duration) -> String {
    format!(
        "exec timeout -k {}s {}s \"${{SHELL:-bash}}\" -c {}",
        crate::sandbox::TERM_GRACE.as_secs(),
        after.as_secs().max(1),
        crate::sandbox::shell_quote(cmd)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_lists_show_the_command_we_ran() {
        let answer = json!({"processes": [
            {"pid": 7, "config": {"cmd": "/bin/bash", "args": ["-l", "-c", "node runner.mjs"]}},
            {"pid": 8, "config": {"cmd": "/usr/bin/sleep", "args": ["60"]}, "tag": "t"},
            {"pid": -1, "config": {}},
        ]});
        assert_eq!(
            process_list(&answer),
            [
                ProcessInfo {
                    pid: 7,
                    cmd: "node runner.mjs".into()
                },
                ProcessInfo {
                    pid: 8,
                    cmd: "/usr/bin/sleep 60".into()
                },
            ]
        );
        assert!(process_list(&json!({})).is_empty());
    }

    #[test]
    fn paths_must_be_absolute() {
        assert!(check_path("/home/user/a").is_ok());
        assert!(check_path("a").is_err());
        assert!(check_path("/a\0b").is_err());
    }
}
