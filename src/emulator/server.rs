//! Starting and stopping the emulator, and routing each request to the control plane or to
//! envd (by its `E2b-Sandbox-Id` header, or a signed `/files` URL's signature).

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use super::config::EmulatorConfig;
use super::http::{self, Handler, Request, Responder, Response};
use super::state::{Shared, Stats};
use super::{control, edge, envd, templates, tunnel};
use crate::errors::error_chain;
use crate::sandbox::local::{Isolation, LocalBackend, LocalOptions};
use crate::sandbox::{Backend, Killed, SandboxError};

/// How long `stop` waits for connection threads to notice.
const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    #[error("the API key must not be empty")]
    EmptyApiKey,
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("cannot open the local backend under {path}")]
    Backend {
        path: PathBuf,
        #[source]
        source: SandboxError,
    },
    #[error("cannot start the accept thread")]
    Thread(#[source] io::Error),
    #[error("the emulator needs bubblewrap to lay sandboxes out as E2B does (/home/user, a private /tmp): {0}")]
    Unconfined(String),
}

/// What `stop` did.
#[derive(Debug, Clone, Default)]
pub struct StopReport {
    /// Sandboxes killed on the way out (E2B ids).
    pub killed: Vec<String>,
    /// Sandboxes whose kill could not be proven, with the reason.
    pub failed: Vec<(String, String)>,
}

/// The entry point: `Emulator::start(config)`.
pub struct Emulator;

impl Emulator {
    /// Binds, opens the backend, and serves on background threads until the handle is
    /// stopped or dropped.
    pub fn start(config: EmulatorConfig) -> Result<EmulatorHandle, EmulatorError> {
        if config.api_key.is_empty() {
            return Err(EmulatorError::EmptyApiKey);
        }
        let listener = http::bind(config.listen).map_err(|source| EmulatorError::Bind {
            addr: config.listen,
            source,
        })?;
        let addr = listener
            .local_addr()
            .map_err(|source| EmulatorError::Bind {
                addr: config.listen,
                source,
            })?;
        let options = LocalOptions {
            isolation: config.isolation,
            create_concurrency: config.create_concurrency,
            system_read_only_to_tasks: true,
            ..LocalOptions::default()
        };
        let backend = LocalBackend::open_with(&config.state_dir, options).map_err(|source| {
            EmulatorError::Backend {
                path: config.state_dir.clone(),
                source,
            }
        })?;
        if backend.isolation() != Isolation::Bwrap {
            return Err(EmulatorError::Unconfined(
                backend
                    .isolation_fallback()
                    .unwrap_or("--isolation none was asked for")
                    .to_string(),
            ));
        }
        let shared = Arc::new(Shared::new(config, backend));
        let accept = spawn_accept(&shared, listener)?;
        Ok(EmulatorHandle {
            addr,
            shared,
            accept: Some(accept),
        })
    }
}

fn spawn_accept(
    shared: &Arc<Shared>,
    listener: TcpListener,
) -> Result<JoinHandle<()>, EmulatorError> {
    let server = Arc::clone(&shared.server);
    let handler: Arc<dyn Handler> = Arc::new(Router(Arc::clone(shared)));
    std::thread::Builder::new()
        .name("emu-accept".into())
        .spawn(move || server.accept_loop(&listener, &handler))
        .map_err(EmulatorError::Thread)
}

/// A running emulator. Dropping it stops it (and kills its sandboxes); `stop` also says
/// what happened.
pub struct EmulatorHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl EmulatorHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`: the value for both `E2B_API_URL` and `E2B_SANDBOX_URL`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// The local sandbox directories' parent, for tests that look behind the emulator.
    pub fn sandboxes_dir(&self) -> PathBuf {
        self.shared.backend.sandboxes_dir().to_path_buf()
    }

    /// Stops serving, cuts every connection, and kills every sandbox this emulator created.
    pub fn stop(mut self) -> StopReport {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> StopReport {
        let Some(accept) = self.accept.take() else {
            return StopReport::default();
        };
        self.shared.server.stop();
        self.shared.signal_stop();
        let entries = self.shared.close_table();
        // In parallel: a kill waits for its process groups to die, up to 5 s each.
        let backend = &self.shared.backend;
        let outcomes: Vec<(String, Result<Killed, SandboxError>)> = entries
            .par_iter()
            .map(|e| (e.id.clone(), backend.kill(&e.local_id)))
            .collect();
        let mut report = StopReport::default();
        for (id, outcome) in outcomes {
            match outcome {
                Ok(Killed::Now) => report.killed.push(id),
                Ok(Killed::AlreadyGone) => {}
                Err(e) => report.failed.push((id, error_chain(&e))),
            }
        }
        let _ = accept.join();
        let until = Instant::now() + STOP_GRACE;
        while self.shared.server.connections() > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        report
    }
}

impl Drop for EmulatorHandle {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

struct Router(Arc<Shared>);

impl Handler for Router {
    fn admit(&self, head: &Request) -> Option<Response> {
        // envd requests are checked against their sandbox's token, in `handle`.
        // Uploads carry their URL's signature, checked in `handle`, as a presigned URL does.
        if edge::target(head).is_some() || envd::is_signed(head) || templates::is_upload(head) {
            return None;
        }
        let refused = control::admit(&self.0, head)?;
        self.0.requests.fetch_add(1, Ordering::SeqCst);
        if let Some(log) = &self.0.config.access_log {
            log(&format!(
                "{} {} {} (body not read)",
                head.method, head.path, refused.status
            ));
        }
        Some(refused)
    }

    fn handle(&self, req: Request, out: &mut Responder<'_>) {
        let shared = &self.0;
        shared.requests.fetch_add(1, Ordering::SeqCst);
        let started = Instant::now();
        let line = shared
            .config
            .access_log
            .as_ref()
            .map(|_| format!("{} {}", req.method, req.path));
        match edge::target(&req) {
            _ if req.method == "CONNECT" => tunnel::connect(shared, req, out),
            Some(t) if t.port == edge::ENVD_PORT => envd::handle(shared, &t.raw_id, req, out),
            Some(t) => edge::relay(shared, &t, req, out),
            None if envd::is_signed(&req) => envd::handle_signed(shared, req, out),
            None => {
                let resp = templates::handle(shared, &req)
                    .unwrap_or_else(|| control::handle(shared, &req));
                let _ = out.send(resp);
            }
        }
        if let (Some(log), Some(line)) = (&shared.config.access_log, line) {
            log(&format!(
                "{line} {} {}ms",
                out.status(),
                started.elapsed().as_millis()
            ));
        }
    }
}
