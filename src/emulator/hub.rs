//! The hub of one process started through envd: a thread that owns the local backend's event
//! channel and fans every chunk out to the streams attached at that moment (envd buffers
//! nothing for late readers), enforces the Start call's `Connect-Timeout-Ms` as the process's
//! lifetime, and keeps the end for 30 s so a late `Connect` can replay it. A process that
//! ends because its sandbox died has no end to report: its streams end as the connection to
//! a dead E2B sandbox does.
//!
//! It sits below the sandbox table (`state`), which holds each sandbox's hubs, so it knows
//! nothing of requests: `envd::process` attaches streams to it.

use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender};
use serde_json::{json, Map, Value};

use crate::sandbox::local::LocalSandbox;
use crate::sandbox::{ProcessEvent, Sandbox};
use crate::sync::lock;

/// How long an ended process can still be `Connect`ed to (envd's retention).
const END_RETENTION: Duration = Duration::from_secs(30);
/// Chunks queued per attached stream before the hub waits for it.
const SUBSCRIBER_BUFFER: usize = 256;
/// How long the hub waits on one stream that stopped reading before detaching it. Until
/// then the process is back-pressured, as envd's fan-out does.
const SUBSCRIBER_STALL: Duration = Duration::from_secs(300);

/// How a process ended, as the `end` event reports it.
#[derive(Debug, Clone)]
pub(super) struct EndInfo {
    exit_code: i32,
    exited: bool,
    status: String,
    error: Option<String>,
}

impl EndInfo {
    fn from_exit(code: Option<i32>) -> EndInfo {
        match code {
            Some(0) => EndInfo {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None,
            },
            Some(n) => EndInfo {
                exit_code: n,
                exited: true,
                status: format!("exit status {n}"),
                error: Some(format!("exit status {n}")),
            },
            // The local backend only says "a signal"; envd's kill is SIGKILL.
            None => EndInfo {
                exit_code: -1,
                exited: false,
                status: "signal: killed".into(),
                error: Some("signal: killed".into()),
            },
        }
    }

    fn failed(message: String) -> EndInfo {
        EndInfo {
            exit_code: -1,
            exited: false,
            status: "unknown".into(),
            error: Some(message),
        }
    }

    /// The `end` event, zero values omitted as ProtoJSON does.
    pub fn to_event(&self) -> Value {
        let mut end = Map::new();
        if self.exit_code != 0 {
            end.insert("exitCode".into(), json!(self.exit_code));
        }
        if self.exited {
            end.insert("exited".into(), json!(true));
        }
        end.insert("status".into(), json!(self.status));
        if let Some(e) = &self.error {
            end.insert("error".into(), json!(e));
        }
        json!({"event": {"end": end}})
    }
}

/// How a process's streams end.
#[derive(Debug, Clone)]
pub(super) enum Ending {
    /// It ended in a sandbox that lives on: its `end` event.
    Exited(EndInfo),
    /// Its sandbox was killed (or reached its end of life) under it.
    SandboxGone,
}

#[derive(Clone)]
pub(super) enum HubEvent {
    Stdout(Arc<Vec<u8>>),
    Stderr(Arc<Vec<u8>>),
    End(Ending),
}

pub(super) enum Subscription {
    Live(Receiver<HubEvent>),
    Ended(Ending),
}

#[derive(Default)]
struct HubState {
    subs: Vec<Sender<HubEvent>>,
    end: Option<Ending>,
    ended_at: Option<Instant>,
}

/// One process started through envd.
pub(super) struct ProcHub {
    pub pid: u32,
    pub tag: Option<String>,
    /// The `ProcessConfig` as requested, which `List` reports back.
    pub config: Value,
    pub stdin_open: AtomicBool,
    state: Mutex<HubState>,
}

impl ProcHub {
    pub fn new(pid: u32, tag: Option<String>, config: Value, stdin: bool) -> ProcHub {
        ProcHub {
            pid,
            tag,
            config,
            stdin_open: AtomicBool::new(stdin),
            state: Mutex::default(),
        }
    }

    pub fn subscribe(&self) -> Subscription {
        let mut st = lock(&self.state);
        if let Some(end) = &st.end {
            return Subscription::Ended(end.clone());
        }
        let (tx, rx) = bounded(SUBSCRIBER_BUFFER);
        st.subs.push(tx);
        Subscription::Live(rx)
    }

    pub fn is_running(&self) -> bool {
        lock(&self.state).end.is_none()
    }

    /// Ended longer ago than the retention window.
    pub fn expired(&self, now: Instant) -> bool {
        lock(&self.state)
            .ended_at
            .is_some_and(|t| now.duration_since(t) > END_RETENTION)
    }

    fn broadcast(&self, event: &HubEvent) {
        let subs = lock(&self.state).subs.clone();
        let mut dead = Vec::new();
        for tx in subs {
            if tx.send_timeout(event.clone(), SUBSCRIBER_STALL).is_err() {
                dead.push(tx);
            }
        }
        if !dead.is_empty() {
            lock(&self.state)
                .subs
                .retain(|s| !dead.iter().any(|d| d.same_channel(s)));
        }
    }

    fn finish(&self, end: Ending) {
        let subs = {
            let mut st = lock(&self.state);
            st.end = Some(end.clone());
            st.ended_at = Some(Instant::now());
            std::mem::take(&mut st.subs)
        };
        for tx in subs {
            let _ = tx.send_timeout(HubEvent::End(end.clone()), SUBSCRIBER_STALL);
        }
    }
}

/// What a hub needs besides its process's events.
pub(super) struct FollowOpts {
    /// When the Start call's deadline kills the process.
    pub kill_at: Option<Instant>,
    pub sandbox: Arc<LocalSandbox>,
    /// Whether the sandbox is gone, asked once the process ended.
    pub sandbox_gone: Box<dyn Fn() -> bool + Send>,
    /// Disconnects when the emulator stops.
    pub stop: Receiver<()>,
}

/// Starts the thread that follows `hub`'s process until it ends, reading `events`.
pub(super) fn follow(
    hub: &Arc<ProcHub>,
    events: Receiver<ProcessEvent>,
    how: FollowOpts,
) -> io::Result<()> {
    let follower = Arc::clone(hub);
    std::thread::Builder::new()
        .name(format!("emu-proc-{}", hub.pid))
        .spawn(move || run_hub(&follower, &events, how))
        .map(drop)
}

/// Follows one process until it ends: fans out its output, kills it at its deadline, and
/// leaves when the emulator stops.
fn run_hub(hub: &ProcHub, events: &Receiver<ProcessEvent>, how: FollowOpts) {
    let FollowOpts {
        mut kill_at,
        sandbox,
        sandbox_gone,
        stop,
    } = how;
    loop {
        let wait = kill_at.map_or(Duration::from_secs(3600), |t| {
            t.saturating_duration_since(Instant::now())
        });
        let event = select! {
            recv(events) -> ev => ev,
            // The emulator stopped: it kills the sandboxes itself.
            recv(stop) -> _ => return,
            default(wait) => {
                if kill_at.is_some_and(|t| Instant::now() >= t) {
                    // envd kills a process whose Start deadline passed, stream or no stream.
                    let _ = sandbox.kill_process(hub.pid);
                    kill_at = None;
                }
                continue;
            }
        };
        let end = match event {
            Ok(ProcessEvent::Stdout(d)) => {
                hub.broadcast(&HubEvent::Stdout(Arc::new(d)));
                continue;
            }
            Ok(ProcessEvent::Stderr(d)) => {
                hub.broadcast(&HubEvent::Stderr(Arc::new(d)));
                continue;
            }
            Ok(ProcessEvent::Exit(code)) => EndInfo::from_exit(code),
            Ok(ProcessEvent::Failed(e)) => EndInfo::failed(e.to_string()),
            Err(_) => {
                EndInfo::failed("the process's output stream ended without an exit status".into())
            }
        };
        // A kill marks the sandbox gone before it kills the processes, so a process it
        // killed always finds it gone here.
        hub.finish(if sandbox_gone() {
            Ending::SandboxGone
        } else {
            Ending::Exited(end)
        });
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_events_omit_zero_values() {
        assert_eq!(
            EndInfo::from_exit(Some(0)).to_event(),
            json!({"event": {"end": {"exited": true, "status": "exit status 0"}}})
        );
        assert_eq!(
            EndInfo::from_exit(Some(3)).to_event(),
            json!({"event": {"end": {"exitCode": 3, "exited": true,
                "status": "exit status 3", "error": "exit status 3"}}})
        );
        assert_eq!(
            EndInfo::from_exit(None).to_event(),
            json!({"event": {"end": {"exitCode": -1, "status": "signal: killed",
                "error": "signal: killed"}}})
        );
    }
}
