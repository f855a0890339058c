//! An open project: its sandbox (resumed when paused, replaced and replayed from the mirror
//! when it is gone), its mirror, and what can be done with it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{
    project_path, projects_dir, validate_name, ExecOutput, Notice, OnIdle, ProjectError,
    ProjectState, EXEC_KILL_AFTER, MAX_EXEC_OUTPUT, WORKSPACE_DIR,
};
use crate::sandbox::ledger::unix_now;
use crate::sandbox::shell_quote;
use crate::sandbox::{
    contained_path, Backend, Captured, CreateSpec, ErrorClass, Killed, Metadata, Network,
    PauseKind, Paused, RunOpts, RunState, Sandbox, SandboxError,
};
use crate::tree::TreeBounds;

/// An open project.
pub struct Project {
    state_dir: PathBuf,
    dir: PathBuf,
    state: ProjectState,
    backend: Arc<dyn Backend>,
    sandbox: Arc<dyn Sandbox>,
    notices: Vec<Notice>,
}

impl Project {
    /// Creates a project and its sandbox. `backend` must lease what it creates.
    pub fn create(
        state_dir: &Path,
        name: &str,
        backend: Arc<dyn Backend>,
        template: Option<String>,
        timeout: Duration,
        on_idle: OnIdle,
    ) -> Result<Project, ProjectError> {
        Self::create_with_network(
            state_dir,
            name,
            backend,
            template,
            timeout,
            on_idle,
            Network::Host,
        )
    }

    /// [`Project::create`] whose sandbox (and every replacement of it) gets `network`.
    pub fn create_with_network(
        state_dir: &Path,
        name: &str,
        backend: Arc<dyn Backend>,
        template: Option<String>,
        timeout: Duration,
        on_idle: OnIdle,
        network: Network,
    ) -> Result<Project, ProjectError> {
        validate_name(name)?;
        let dir = projects_dir(state_dir).join(name);
        if dir.join("project.json").exists() {
            return Err(ProjectError::Exists(name.to_string()));
        }
        let state_err = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| ProjectError::State { what, path, source }
        };
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir.join("mirror"))
                .map_err(state_err("create", &dir))?;
        }
        let sandbox = create_sandbox(
            backend.as_ref(),
            template.as_deref(),
            timeout,
            on_idle,
            network,
        )?;
        let state = ProjectState {
            name: name.to_string(),
            backend: backend.name().to_string(),
            template,
            lease: lease_of(backend.as_ref(), sandbox.id()),
            sandbox_id: sandbox.id().to_string(),
            timeout_secs: timeout.as_secs(),
            created: unix_now(),
            replacements: 0,
            on_idle,
            network,
        };
        let project = Project {
            state_dir: state_dir.to_path_buf(),
            dir,
            state,
            backend,
            sandbox,
            notices: Vec::new(),
        };
        if let Err(e) = project.init_workspace().and_then(|()| project.save()) {
            let _ = project.backend.kill(project.sandbox.id());
            let _ = crate::deep_remove::remove_tree(&project.dir);
            return Err(e);
        }
        Ok(project)
    }

    /// Opens an existing project: a paused sandbox is resumed, one that is gone is replaced
    /// and the mirror replayed. A project that pauses when idle gets its whole idle window
    /// again from now.
    pub fn open(
        state_dir: &Path,
        name: &str,
        backend: Arc<dyn Backend>,
    ) -> Result<Project, ProjectError> {
        let (dir, state) = load(state_dir, name, backend.as_ref())?;
        let mut notices = Vec::new();
        let sandbox = match backend.describe(&state.sandbox_id) {
            Ok(found) => {
                let sandbox = match backend.connect(&state.sandbox_id) {
                    Ok(s) => Some(s),
                    Err(e) if e.class() == ErrorClass::Gone => None,
                    Err(e) => {
                        return Err(ProjectError::sandbox("connect to the project sandbox")(e))
                    }
                };
                if sandbox.is_some() && found.state == RunState::Paused {
                    notices.push(Notice::Resumed {
                        id: state.sandbox_id.clone(),
                    });
                }
                sandbox
            }
            Err(e) if e.class() == ErrorClass::Gone => None,
            Err(e) => return Err(ProjectError::sandbox("look up the project sandbox")(e)),
        };
        let replaced = sandbox.is_none();
        let mut project = Project {
            state_dir: state_dir.to_path_buf(),
            dir,
            sandbox: match sandbox {
                Some(s) => s,
                None => create_sandbox(
                    backend.as_ref(),
                    state.template.as_deref(),
                    Duration::from_secs(state.timeout_secs),
                    state.on_idle,
                    state.network,
                )?,
            },
            state,
            backend,
            notices,
        };
        if replaced {
            project.adopt_replacement()?;
        } else if project.state.on_idle != OnIdle::Kill {
            project.renew_idle()?;
        }
        Ok(project)
    }

    /// Pauses the project's sandbox without resuming it first; `None` when it is gone (the
    /// next command replaces it).
    pub fn pause(
        state_dir: &Path,
        name: &str,
        backend: &dyn Backend,
        kind: PauseKind,
    ) -> Result<Option<Paused>, ProjectError> {
        let (_, state) = load(state_dir, name, backend)?;
        match backend.pause(&state.sandbox_id, kind) {
            Ok(p) => Ok(Some(p)),
            Err(e) if e.class() == ErrorClass::Gone => Ok(None),
            Err(e) => Err(ProjectError::sandbox("pause the project sandbox")(e)),
        }
    }

    /// Whether the recorded project's sandbox runs, is paused, or is gone (`None`), without
    /// resuming it.
    pub fn sandbox_state(
        state: &ProjectState,
        backend: &dyn Backend,
    ) -> Result<Option<RunState>, ProjectError> {
        same_backend(state, backend)?;
        match backend.describe(&state.sandbox_id) {
            Ok(s) => Ok(Some(s.state)),
            Err(e) if e.class() == ErrorClass::Gone => Ok(None),
            Err(e) => Err(ProjectError::sandbox("look up the project sandbox")(e)),
        }
    }

    /// Kills the project's sandbox, running or paused (retiring its lease), and removes the
    /// project's state. A sandbox that is gone already is not replaced first.
    pub fn close(
        state_dir: &Path,
        name: &str,
        backend: &dyn Backend,
    ) -> Result<(ProjectState, Killed), ProjectError> {
        let (dir, state) = load(state_dir, name, backend)?;
        let killed = match backend.kill(&state.sandbox_id) {
            Ok(k) => k,
            Err(e) if e.class() == ErrorClass::Gone => Killed::AlreadyGone,
            Err(e) => return Err(ProjectError::sandbox("kill the project sandbox")(e)),
        };
        crate::deep_remove::remove_tree(&dir).map_err(|source| ProjectError::State {
            what: "remove",
            path: dir.clone(),
            source,
        })?;
        Ok((state, killed))
    }

    /// Replays the mirror into a freshly created sandbox and records it.
    fn adopt_replacement(&mut self) -> Result<(), ProjectError> {
        let old = std::mem::replace(&mut self.state.sandbox_id, self.sandbox.id().to_string());
        self.state.lease = lease_of(self.backend.as_ref(), self.sandbox.id());
        self.state.replacements += 1;
        let replay = self.init_workspace().and_then(|()| {
            let mirror = self.mirror()?;
            for (rel, content) in &mirror {
                self.write_sandbox(rel, content)?;
            }
            Ok(mirror.len())
        });
        let files = match replay {
            Ok(n) => n,
            Err(e) => {
                let _ = self.backend.kill(self.sandbox.id());
                return Err(e);
            }
        };
        self.save()?;
        self.notices.push(Notice::Replaced {
            old,
            new: self.sandbox.id().to_string(),
            files,
        });
        Ok(())
    }

    /// Moves the project to a fresh sandbox: the mirror is replayed into it, then the old
    /// one is killed (its lease retired).
    pub fn replace(&mut self) -> Result<(), ProjectError> {
        let fresh = create_sandbox(
            self.backend.as_ref(),
            self.state.template.as_deref(),
            Duration::from_secs(self.state.timeout_secs),
            self.state.on_idle,
            self.state.network,
        )?;
        let old = std::mem::replace(&mut self.sandbox, fresh);
        self.adopt_replacement()?;
        let _ = self.backend.kill(old.id());
        Ok(())
    }

    pub fn state(&self) -> &ProjectState {
        &self.state
    }

    pub fn sandbox(&self) -> &Arc<dyn Sandbox> {
        &self.sandbox
    }

    /// Notices gathered so far (drained).
    pub fn take_notices(&mut self) -> Vec<Notice> {
        std::mem::take(&mut self.notices)
    }

    /// The absolute workspace directory inside the sandbox.
    pub fn workspace(&self) -> String {
        format!(
            "{}/{WORKSPACE_DIR}",
            self.sandbox.home().trim_end_matches('/')
        )
    }

    fn init_workspace(&self) -> Result<(), ProjectError> {
        let out = self
            .sandbox
            .run(
                &format!("mkdir -p {WORKSPACE_DIR}"),
                &RunOpts {
                    // The workspace is named relative to home, whatever the template's own
                    // working directory.
                    cwd: Some(self.sandbox.home().to_string()),
                    timeout: Duration::from_secs(30),
                    max_output: 4096,
                    ..RunOpts::default()
                },
            )
            .map_err(ProjectError::sandbox("create the workspace"))?;
        if out.exit_code == Some(0) {
            Ok(())
        } else {
            Err(ProjectError::Sandbox {
                what: "create the workspace".into(),
                source: SandboxError::Remote {
                    class: ErrorClass::BadRequest,
                    message: out.stderr.to_text(),
                    source: None,
                },
            })
        }
    }

    fn save(&self) -> Result<(), ProjectError> {
        let path = self.dir.join("project.json");
        let err = |source| ProjectError::State {
            what: "write",
            path: path.clone(),
            source,
        };
        let json = serde_json::to_vec_pretty(&self.state).map_err(|e| err(e.into()))?;
        atomic_write(&path, &json).map_err(err)
    }

    fn mirror_path(&self, rel: &str) -> PathBuf {
        self.dir.join("mirror").join(rel)
    }

    fn write_mirror(&self, rel: &str, content: &[u8]) -> Result<(), ProjectError> {
        let path = self.mirror_path(rel);
        let err = |source| ProjectError::State {
            what: "mirror",
            path: path.clone(),
            source,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(err)?;
        }
        atomic_write(&path, content).map_err(err)
    }

    /// Every mirrored file, by project path.
    pub fn mirror(&self) -> Result<BTreeMap<String, Vec<u8>>, ProjectError> {
        let root = self.dir.join("mirror");
        let mut out = BTreeMap::new();
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            let rd = match std::fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => {
                    return Err(ProjectError::State {
                        what: "read",
                        path: dir,
                        source,
                    })
                }
            };
            for entry in rd.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else if let (Ok(rel), Ok(bytes)) =
                    (path.strip_prefix(&root), std::fs::read(&path))
                {
                    if !rel.to_string_lossy().ends_with(".wmo-tmp") {
                        out.insert(rel.to_string_lossy().into_owned(), bytes);
                    }
                }
            }
        }
        Ok(out)
    }

    fn write_sandbox(&self, rel: &str, content: &[u8]) -> Result<(), ProjectError> {
        let full = contained_path(&self.workspace(), rel).map_err(|e| ProjectError::BadPath {
            path: rel.to_string(),
            reason: e.to_string(),
        })?;
        self.sandbox
            .write_file(&full, content)
            .map_err(ProjectError::sandbox(format!("write {rel}")))
    }

    /// Writes a file into the project and its mirror.
    pub fn put(&mut self, path: &str, content: &[u8]) -> Result<String, ProjectError> {
        let rel = project_path(path)?;
        self.write_sandbox(&rel, content)?;
        self.write_mirror(&rel, content)?;
        Ok(rel)
    }

    /// Reads a file; when the sandbox cannot answer, the mirror does.
    pub fn get(&mut self, path: &str) -> Result<Vec<u8>, ProjectError> {
        let rel = project_path(path)?;
        let full = contained_path(&self.workspace(), &rel).map_err(|e| ProjectError::BadPath {
            path: rel.clone(),
            reason: e.to_string(),
        })?;
        match self.sandbox.read_file(&full) {
            Ok(bytes) => Ok(bytes),
            // A symlink out of the sandbox: refused, and never answered from the mirror
            // either, which may hold an older file of that name.
            Err(SandboxError::BadPath { reason, .. }) => Err(ProjectError::BadPath {
                path: rel,
                reason: reason.to_string(),
            }),
            Err(e) => match std::fs::read(self.mirror_path(&rel)) {
                Ok(bytes) => Ok(bytes),
                Err(_) if e.class() == ErrorClass::BadRequest => {
                    Err(ProjectError::Missing { path: rel })
                }
                Err(_) => Err(ProjectError::sandbox(format!("read {rel}"))(e)),
            },
        }
    }

    /// Runs `bash -c command` in the workspace, bounded by `timeout` (TERM, then KILL after a
    /// grace period). A non-zero exit is a result.
    pub fn exec(&self, command: &str, timeout: Duration) -> Result<ExecOutput, ProjectError> {
        let wall = timeout + EXEC_KILL_AFTER + Duration::from_secs(20);
        let held = self.hold_for(wall)?;
        let secs = timeout.as_secs().max(1);
        let script = format!(
            "cd {WORKSPACE_DIR} && exec timeout --kill-after={}s {secs}s bash --noprofile --norc -c {}",
            EXEC_KILL_AFTER.as_secs(),
            shell_quote(command)
        );
        let out = self
            .sandbox
            .run(
                &script,
                &RunOpts {
                    cwd: Some(self.sandbox.home().to_string()),
                    timeout: wall,
                    max_output: MAX_EXEC_OUTPUT,
                    ..RunOpts::default()
                },
            )
            .map_err(ProjectError::sandbox("run the command"))?;
        if held {
            self.renew_idle()?;
        }
        let merged = Captured::merged(&[&out.stdout, &out.stderr], MAX_EXEC_OUTPUT);
        let timed_out = out.timed_out || out.exit_code == Some(124);
        Ok(ExecOutput {
            exit_code: out.exit_code,
            output: merged.to_text(),
            timed_out,
        })
    }

    /// Keeps the sandbox up through an operation of at most `d`: when `d` outlasts the
    /// project's timeout, the deadline moves to cover it (the sandbox must not pause or die
    /// mid-command). Returns whether it moved, so the caller renews the idle window after.
    pub(crate) fn hold_for(&self, d: Duration) -> Result<bool, ProjectError> {
        let secs = d.as_secs().saturating_add(30);
        if secs <= self.state.timeout_secs {
            return Ok(false);
        }
        self.sandbox
            .set_timeout(secs)
            .map_err(ProjectError::sandbox("keep the project sandbox up"))?;
        Ok(true)
    }

    /// Starts the project's timeout again from now.
    pub(crate) fn renew_idle(&self) -> Result<(), ProjectError> {
        self.sandbox
            .set_timeout(self.state.timeout_secs)
            .map_err(ProjectError::sandbox(
                "renew the project sandbox's idle timeout",
            ))
    }

    /// Writes a local tree under `dest`, after validating all of it.
    pub fn stage(
        &mut self,
        from: &Path,
        dest: &str,
        bounds: TreeBounds,
    ) -> Result<usize, ProjectError> {
        let dest = project_path(dest)?;
        let files = crate::tree::read_tree(from, bounds)?;
        // Every target path is checked before the first write.
        let targets: Vec<(String, &String)> = files
            .iter()
            .map(|(rel, content)| project_path(&format!("{dest}/{rel}")).map(|p| (p, content)))
            .collect::<Result<_, _>>()?;
        for (rel, content) in &targets {
            self.write_sandbox(rel, content.as_bytes())?;
            self.write_mirror(rel, content.as_bytes())?;
        }
        Ok(targets.len())
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }
}

/// Reads a project's recorded state, refusing one made on another backend.
fn load(
    state_dir: &Path,
    name: &str,
    backend: &dyn Backend,
) -> Result<(PathBuf, ProjectState), ProjectError> {
    validate_name(name)?;
    let dir = projects_dir(state_dir).join(name);
    let path = dir.join("project.json");
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ProjectError::NotFound(name.to_string()))
        }
        Err(source) => {
            return Err(ProjectError::State {
                what: "read",
                path,
                source,
            })
        }
    };
    let state: ProjectState = serde_json::from_slice(&bytes).map_err(|e| ProjectError::State {
        what: "parse",
        path: path.clone(),
        source: e.into(),
    })?;
    same_backend(&state, backend)?;
    Ok((dir, state))
}

/// Refuses a backend other than the one the project lives on.
fn same_backend(state: &ProjectState, backend: &dyn Backend) -> Result<(), ProjectError> {
    if state.backend == backend.name() {
        return Ok(());
    }
    Err(ProjectError::WrongBackend {
        name: state.name.clone(),
        backend: state.backend.clone(),
        wanted: backend.name().to_string(),
    })
}

fn create_sandbox(
    backend: &dyn Backend,
    template: Option<&str>,
    timeout: Duration,
    on_idle: OnIdle,
    network: Network,
) -> Result<Arc<dyn Sandbox>, ProjectError> {
    let created = backend.create(&CreateSpec {
        template: template.map(str::to_string),
        timeout_secs: timeout.as_secs(),
        metadata: Metadata::new(),
        envs: Vec::new(),
        internet: network != Network::None,
        on_timeout: on_idle.on_timeout(),
        // A project's agent is as untrusted as an eval's: the host is bounded the same way.
        limits: crate::sandbox::Limits::defaults(),
        network,
        image: None,
    });
    if matches!(created, Err(SandboxError::CreateUnconfirmed { .. })) {
        // The create may have made a sandbox no one will use: find it by its lease tag and
        // kill it before this command exits, as an eval does. What cannot be found is left
        // to `reap`, its lease still `creating`.
        let _ = backend.settle_creates();
    }
    created.map_err(ProjectError::sandbox("create the project sandbox"))
}

/// The lease tag the backend put on a sandbox.
fn lease_of(backend: &dyn Backend, id: &str) -> Option<String> {
    backend
        .describe(id)
        .ok()?
        .metadata
        .get(crate::sandbox::ledger::TAG_LEASE)
        .cloned()
}

fn atomic_write(path: &Path, content: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(".wmo-tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(content)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}
