//! `wmo-e2b emulator` as a process, and the CLI pointed at it as at E2B: the real binary on
//! both sides.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::{signal, Env};

pub const KEY: &str = "e2b_0123456789abcdef0123456789abcdef01234567";

pub struct Emulator {
    pub child: Child,
    pub url: String,
}

impl Emulator {
    pub fn start(state: &Path, extra: &[&str]) -> Emulator {
        let mut c = Command::new(env!("CARGO_BIN_EXE_wmo-e2b"));
        c.arg("emulator").arg("--state-dir").arg(state).args(extra);
        c.stderr(Stdio::null());
        Emulator::spawn(c)
    }

    /// An emulator with `env`'s state as its `WMO_E2B_HOME` (its image store, its
    /// `registries.toml`), each request it answers logged to `log`.
    pub fn start_on(env: &Env, extra: &[&str], log: &Path) -> Emulator {
        let mut c = env.cmd(&["emulator", "--verbose"]);
        c.arg("--state-dir").arg(env.path("emu")).args(extra);
        c.stderr(std::fs::File::create(log).unwrap());
        Emulator::spawn(c)
    }

    fn spawn(mut c: Command) -> Emulator {
        let mut child = c
            .args(["--listen", "127.0.0.1:0", "--api-key", KEY, "--json"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
        Emulator {
            url: v["url"].as_str().unwrap().to_string(),
            child,
        }
    }

    /// Sandboxes the emulator still runs.
    pub fn live(&self) -> Vec<Value> {
        let mut resp = ureq::get(&format!("{}/v2/sandboxes?limit=100", self.url))
            .header("X-API-Key", KEY)
            .call()
            .unwrap();
        resp.body_mut().read_json::<Vec<Value>>().unwrap()
    }

    /// How many sandboxes run once no create is in flight (the count holds still).
    pub fn settled_live_count(&self) -> usize {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut last = self.live().len();
        let mut still = 0;
        while still < 10 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            let now = self.live().len();
            still = if now == last { still + 1 } else { 0 };
            last = now;
        }
        last
    }

    pub fn stats(&self) -> Value {
        let mut resp = ureq::get(&format!("{}/_emulator/stats", self.url))
            .header("X-API-Key", KEY)
            .call()
            .unwrap();
        resp.body_mut().read_json::<Value>().unwrap()
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        signal(&self.child, libc::SIGTERM);
        let _ = self.child.wait();
    }
}

/// The CLI with `args` on `env`'s state, pointed at the emulator as at E2B.
pub fn e2b(env: &Env, emu: &Emulator, args: &[&str]) -> Command {
    let mut c = env.cmd(args);
    c.env("E2B_API_KEY", KEY)
        .env("E2B_API_URL", &emu.url)
        .env("E2B_SANDBOX_URL", &emu.url)
        .env_remove("E2B_DEBUG");
    c
}

/// `eval --backend e2b` of `tasks` into `out`, with `extra` options.
pub fn eval_cmd(env: &Env, emu: &Emulator, tasks: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut c = e2b(env, emu, &["eval", "--backend", "e2b", "--tasks"]);
    c.arg(tasks).arg("--out").arg(out).args(extra);
    c
}
