//! Projects that pause, on the local backend and on E2B (through the emulator): a paused
//! project keeps what the mirror never saw (installed files, with a memory pause its running
//! processes), its idle timeout pauses instead of killing, and neither reap nor close makes
//! or breaks what the project holds.

use std::process::Output;
use std::time::Duration;

use serde_json::Value;

mod support;

use support::emulator::{self, Emu};
use support::{killed_by, reap_report, text, wait_for, Env};

/// A background loop that outlives the command starting it: it records its pid and stamps
/// the time every 100 ms, so a pause shows as a gap and a resume as stamps after it.
const START_LOOP: &str = "(setsid sh -c 'echo $$ > ~/loop.pid; \
    while :; do date +%s%N >> ~/stamps; sleep 0.1; done' >/dev/null 2>&1 </dev/null &); \
    mkdir -p ~/.cache/tool && echo installed > ~/.cache/tool/marker";

/// Where the project lives: the local backend, or the emulator standing in for E2B.
enum On {
    Local,
    E2b(Box<Emu>),
}

/// A project named `demo`, created with `extra` options.
struct Demo {
    env: Env,
    on: On,
}

impl Demo {
    fn new(on: On, extra: &[&str]) -> Demo {
        let demo = Demo {
            env: Env::new(),
            on,
        };
        let backend = demo.backend();
        let mut args = vec!["project", "create", "demo", "--backend", backend];
        args.extend_from_slice(extra);
        let o = demo.cli(&args);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        demo
    }

    fn backend(&self) -> &'static str {
        match self.on {
            On::Local => "local",
            On::E2b(_) => "e2b",
        }
    }

    fn cli(&self, args: &[&str]) -> Output {
        let mut c = self.env.cmd(args);
        if let On::E2b(emu) = &self.on {
            c.env("E2B_API_KEY", emulator::KEY)
                .env("E2B_API_URL", &emu.url)
                .env("E2B_SANDBOX_URL", &emu.url)
                .env_remove("E2B_DEBUG");
        }
        c.output().unwrap()
    }

    /// Runs `command` in the project; its stdout, after asserting it exited 0.
    fn exec(&self, command: &str) -> String {
        let o = self.cli(&["project", "exec", "demo", "--shell", command]);
        assert_eq!(o.status.code(), Some(0), "{command}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn listed(&self) -> Value {
        let o = self.cli(&["project", "list", "--json"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let v: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
        v.into_iter().next().expect("the project is listed")
    }

    fn state(&self) -> String {
        self.listed()["sandbox_state"].as_str().unwrap().to_string()
    }

    fn pause(&self, extra: &[&str]) {
        let mut args = vec!["project", "pause", "demo"];
        args.extend_from_slice(extra);
        let o = self.cli(&args);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("paused project demo"),
            "{}",
            text(&o)
        );
        assert_eq!(self.state(), "paused");
    }

    /// Whether the loop started by [`START_LOOP`] still runs.
    fn loop_alive(&self) -> bool {
        self.exec("kill -0 \"$(cat ~/loop.pid)\" 2>/dev/null && echo alive || echo dead")
            .trim()
            == "alive"
    }

    fn stamps(&self) -> Vec<u128> {
        self.exec("cat ~/stamps")
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

fn e2b() -> On {
    On::E2b(Box::new(emulator::start()))
}

/// The longest wait between two stamps, in seconds.
fn longest_gap(stamps: &[u128]) -> f64 {
    stamps
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]) as f64 / 1e9)
        .fold(0.0, f64::max)
}

/// A memory pause between two commands: the loop neither ran nor died while paused, and
/// carries on after the resume; the installed file is there.
fn memory_pause_keeps_processes_and_files(on: On) {
    let demo = Demo::new(on, &[]);
    demo.exec(START_LOOP);
    wait_for("the loop's first stamps", Duration::from_secs(10), || {
        demo.stamps().len() >= 3
    });
    demo.pause(&[]);
    std::thread::sleep(Duration::from_millis(1500));
    let o = demo.cli(&[
        "project",
        "exec",
        "demo",
        "--shell",
        "cat ~/.cache/tool/marker",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "installed\n");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("resumed project demo's paused sandbox"),
        "{}",
        text(&o)
    );
    assert_eq!(demo.state(), "running");
    assert!(demo.loop_alive(), "the loop died in a memory pause");
    let gap = longest_gap(&demo.stamps());
    assert!(
        gap >= 1.2,
        "the loop kept running while paused (longest gap {gap:.2} s)"
    );
    let before = demo.stamps().len();
    wait_for("stamps after the resume", Duration::from_secs(10), || {
        demo.stamps().len() > before
    });
    let o = demo.cli(&["project", "close", "demo"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn a_memory_pause_keeps_processes_and_files_locally() {
    memory_pause_keeps_processes_and_files(On::Local);
}

#[test]
fn a_memory_pause_keeps_processes_and_files_on_e2b() {
    memory_pause_keeps_processes_and_files(e2b());
}

/// A filesystem-only pause: the installed file is there after the resume, the loop is not.
fn filesystem_pause_keeps_files_only(on: On) {
    let demo = Demo::new(on, &[]);
    demo.exec(START_LOOP);
    wait_for("the loop's first stamps", Duration::from_secs(10), || {
        demo.stamps().len() >= 2
    });
    demo.pause(&["--filesystem-only"]);
    assert_eq!(demo.exec("cat ~/.cache/tool/marker"), "installed\n");
    assert!(!demo.loop_alive(), "a process outlived a filesystem pause");
    let o = demo.cli(&["project", "close", "demo"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn a_filesystem_pause_keeps_files_and_ends_processes_locally() {
    filesystem_pause_keeps_files_only(On::Local);
}

#[test]
fn a_filesystem_pause_keeps_files_and_ends_processes_on_e2b() {
    filesystem_pause_keeps_files_only(e2b());
}

/// An idle project pauses at its timeout instead of dying, and the next command finds it
/// as it was, the loop still there.
fn idle_timeout_pauses(on: On) {
    let demo = Demo::new(on, &["--timeout", "3s"]);
    demo.exec(START_LOOP);
    // Running before the pause, or its survival proves nothing.
    wait_for("the loop's first stamps", Duration::from_secs(10), || {
        demo.stamps().len() >= 2
    });
    wait_for("the idle project to pause", Duration::from_secs(30), || {
        demo.state() == "paused"
    });
    assert!(demo.loop_alive(), "the loop died when the project idled");
    assert_eq!(demo.exec("cat ~/.cache/tool/marker"), "installed\n");
    assert_eq!(demo.listed()["replacements"], 0, "the sandbox was replaced");
    let o = demo.cli(&["project", "close", "demo"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn an_idle_project_pauses_instead_of_dying_locally() {
    idle_timeout_pauses(On::Local);
}

#[test]
fn an_idle_project_pauses_instead_of_dying_on_e2b() {
    idle_timeout_pauses(e2b());
}

/// Reap beside a paused project, its creating command long gone: nothing is killed, and
/// the project resumes with its loop.
fn reap_leaves_a_paused_project_alone(on: On) {
    let demo = Demo::new(on, &[]);
    demo.exec(START_LOOP);
    // Running before the pause, or its survival proves nothing.
    wait_for("the loop's first stamps", Duration::from_secs(10), || {
        demo.stamps().len() >= 2
    });
    demo.pause(&[]);
    let o = demo.cli(&["reap", "--json", "--backend", demo.backend()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report = reap_report(&o);
    assert_eq!(
        killed_by(&report),
        0,
        "reap killed a paused project: {report}"
    );
    assert_eq!(demo.state(), "paused", "reap touched the paused sandbox");
    assert!(demo.loop_alive(), "the loop did not survive the reap");
    let o = demo.cli(&["project", "close", "demo"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn reap_beside_a_paused_project_touches_nothing_locally() {
    reap_leaves_a_paused_project_alone(On::Local);
}

#[test]
fn reap_beside_a_paused_project_touches_nothing_on_e2b() {
    reap_leaves_a_paused_project_alone(e2b());
}

/// Closing a project whose sandbox vanished creates nothing: one lease ever, and on E2B one
/// create. A paused project's sandbox is killed by close as well.
fn close_creates_nothing(on: On) {
    let demo = Demo::new(on, &[]);
    let id = demo.listed()["sandbox_id"].as_str().unwrap().to_string();
    let o = demo.cli(&["sandbox", "kill", "--backend", demo.backend(), &id]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(demo.state(), "gone");
    let o = demo.cli(&["project", "close", "demo"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("was gone already"),
        "{}",
        text(&o)
    );
    let (leases, _) = wmo_e2b::sandbox::ledger::read_leases(&demo.env.home());
    assert_eq!(leases.len(), 1, "close made another sandbox: {leases:?}");
    if let On::E2b(emu) = &demo.on {
        assert_eq!(emu.handle.stats().creates, 1, "close created a sandbox");
    }

    // A paused one is killed, not left behind.
    let demo = Demo::new(
        match demo.on {
            On::Local => On::Local,
            On::E2b(_) => e2b(),
        },
        &[],
    );
    demo.pause(&[]);
    let o = demo.cli(&["project", "close", "demo"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = demo.cli(&["sandbox", "list", "--json", "--backend", demo.backend()]);
    let rows: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert!(rows.is_empty(), "close left a paused sandbox: {rows:?}");
}

#[test]
fn close_of_a_vanished_project_creates_nothing_locally() {
    close_creates_nothing(On::Local);
}

#[test]
fn close_of_a_vanished_project_creates_nothing_on_e2b() {
    close_creates_nothing(e2b());
}

/// A command that outlasts the idle timeout keeps the sandbox up to its end instead of
/// pausing under it; the idle window starts again after it.
fn long_command_holds_off_the_pause(on: On) {
    let demo = Demo::new(on, &["--timeout", "2s"]);
    let o = demo.cli(&[
        "project",
        "exec",
        "demo",
        "--timeout",
        "30s",
        "--shell",
        "sleep 5; echo done",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "done\n");
    wait_for("the idle project to pause", Duration::from_secs(30), || {
        demo.state() == "paused"
    });
    let o = demo.cli(&["project", "close", "demo"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn a_command_longer_than_the_idle_timeout_finishes_locally() {
    long_command_holds_off_the_pause(On::Local);
}

#[test]
fn a_command_longer_than_the_idle_timeout_finishes_on_e2b() {
    long_command_holds_off_the_pause(e2b());
}

/// Without namespaces a local sandbox cannot pause its memory: by default the project then
/// pauses with its files, saying so; asking for a memory pause is refused by name.
#[test]
fn without_namespaces_a_project_pauses_with_its_files_by_default() {
    let env = Env::new();
    let o = env.run(&["project", "--isolation", "none", "create", "demo"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("pauses with its files only"),
        "{}",
        text(&o)
    );
    let o = env.run(&["project", "list", "--json"]);
    let listed: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(listed[0]["on_idle"], "pause-filesystem", "{listed:?}");

    let o = env.run(&[
        "project",
        "--isolation",
        "none",
        "create",
        "other",
        "--on-idle",
        "pause",
    ]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("needs --isolation bwrap"),
        "{}",
        text(&o)
    );
    let o = env.run(&["project", "close", "demo"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}
