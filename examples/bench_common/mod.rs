//! What the benchmark examples share: their argument parsing, CPU and memory readings of
//! this process and of others, medians, and the episode pieces the reference measures with.
//!
//! Each example uses a subset: dead code is allowed.

#![allow(dead_code)]

use serde_json::{Map, Value};
use wmo_e2b::cancel::CancelToken;
use wmo_e2b::environment::{EnvError, Environment, ToolOutput};
use wmo_e2b::sandbox::CreateSpec;

pub fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

/// CPU seconds (user + system) this process has used, all threads.
pub fn self_cpu_s() -> f64 {
    rusage_cpu_s(libc::RUSAGE_SELF)
}

/// CPU seconds (user + system) of this process's reaped children and their reaped
/// descendants.
pub fn children_cpu_s() -> f64 {
    rusage_cpu_s(libc::RUSAGE_CHILDREN)
}

fn rusage_cpu_s(who: libc::c_int) -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

pub fn proc_cpu_s(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let rest: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect();
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let field = |i: usize| {
        rest.get(i)
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field(11) + field(12)) / ticks
}

pub fn proc_status_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if s.is_empty() {
        return f64::NAN;
    }
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// The variables the local backend passes to sandbox processes (`process.rs`), plus HOME.
pub fn scrubbed(c: &mut std::process::Command) -> &mut std::process::Command {
    const PASSTHROUGH: &[&str] = &[
        "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "USER", "LOGNAME", "SHELL", "TMPDIR",
        "HOME",
    ];
    c.env_clear();
    for key in PASSTHROUGH {
        if let Some(v) = std::env::var_os(key) {
            c.env(key, v);
        }
    }
    c
}

/// Answers every tool call at once, as the reference's InstantEnv does.
pub struct InstantEnv;

impl Environment for InstantEnv {
    fn execute(
        &self,
        _name: &str,
        _args: &Map<String, Value>,
        _cancel: &CancelToken,
    ) -> Result<ToolOutput, EnvError> {
        Ok(ToolOutput::ok("hello\n"))
    }
}

pub fn spec() -> CreateSpec {
    let mut metadata = wmo_e2b::sandbox::Metadata::new();
    metadata.insert("wmo-e2b.kind".into(), "bench".into());
    CreateSpec {
        template: None,
        timeout_secs: 900,
        metadata,
        envs: Vec::new(),
        internet: true,
        on_timeout: wmo_e2b::sandbox::OnTimeout::Kill,
        // What eval gives every sandbox unless told otherwise.
        limits: wmo_e2b::sandbox::Limits::defaults(),
        network: Default::default(),
        image: None,
    }
}

pub fn ms(v: f64) -> f64 {
    (v * 1e6).round() / 1e3
}

/// The first process below `pid` (itself included) whose command name is `name`: a sandbox
/// process's pid is its launcher's, and what it launched (the runner's node) is a child.
pub fn descendant_named(pid: u32, name: &str) -> Option<u32> {
    let stat = |p: u32| -> Option<(String, u32)> {
        let s = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        let (head, rest) = s.rsplit_once(')')?;
        let comm = head.split_once('(')?.1.to_string();
        let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
        Some((comm, ppid))
    };
    let all: Vec<(u32, String, u32)> = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|p| stat(p).map(|(comm, ppid)| (p, comm, ppid)))
        .collect();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        if all.iter().any(|(q, comm, _)| *q == p && comm == name) {
            return Some(p);
        }
        todo.extend(
            all.iter()
                .filter(|(_, _, ppid)| *ppid == p)
                .map(|(q, _, _)| *q),
        );
    }
    None
}
