//! A verdict the agent cannot reach, on the local backend: the agent is stopped before its
//! work is verified, and the verifier runs as another identity with a fixed environment, in
//! the agent's sandbox or in a fresh one (`--verifier separate`). The same forgeries run on
//! E2B through the emulator in `eval_e2b`.

mod support;

use support::{attacks, text, transcript_frames, Env};

#[test]
fn no_forgery_passes_a_failing_verify() {
    let env = Env::new();
    let tasks = env.write_tasks(&attacks::tasks());
    let o = env.eval(&tasks, &["-j", "2"]);
    attacks::check(&env.results());
    assert!(env.live_sandboxes().is_empty(), "{}", text(&o));
}

#[test]
fn the_verifier_is_not_the_agent_and_reads_nothing_it_left() {
    // As root the verifier has a uid of its own; in a user namespace only one uid exists.
    let root = unsafe { libc::geteuid() } == 0;
    let agent = "id -u > agent_uid; echo 'exit 0' >> ~/.bashrc; echo 'exit 0' > ~/.bash_profile; \
                 echo 'export FORGED=1' > ~/.profile; echo done";
    let uid_check = if root {
        "test \"$(id -u)\" != \"$(cat agent_uid)\" && test \"$(id -un)\" = verifier && "
    } else {
        ""
    };
    let verify = format!(
        "{uid_check}test \"$HOME\" != /home/user && test -z \"$(ls -A \"$HOME\")\" && \
         test \"$PYTHONNOUSERSITE\" = 1 && test -z \"${{FORGED:-}}\" && test -z \"${{BASH_ENV:-}}\" && \
         test \"$PWD\" = /home/user/workspace && touch written-by-verifier && \
         python3 -c 'import site, sys; sys.exit(site.ENABLE_USER_SITE is not False)'"
    );
    let line = serde_json::json!({
        "id": "who",
        "instruction": "x",
        "model_script": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": agent}}]},
            {"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]},
        ],
        "verify": verify,
    });
    let env = Env::new();
    let tasks = env.write_tasks(&[line.to_string()]);
    let o = env.eval(&tasks, &[]);
    let r = env.result("who");
    assert_eq!(r["status"], "passed", "{r}\n{}", text(&o));
}

/// A harness's code runs in the runner: what it starts beside it is ended before verify,
/// and its sandbox (whose runner's memory no reset can prove clean) is never reused.
#[test]
fn a_harness_cannot_forge_a_verdict_or_outlive_its_task() {
    let env = Env::new();
    let dir = env.path("harness");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("agent.mjs"),
        r#"import { spawn } from "node:child_process";
import { appendFileSync } from "node:fs";
export async function runEpisode(ctx) {
  const loop = "while :; do echo 7 > /home/user/workspace/out.txt; sleep 0.02; done";
  spawn("sh", ["-c", loop], { detached: true, stdio: "ignore" }).unref();
  try { appendFileSync("/opt/wmo-e2b/runner.mjs", "\n// tampered\n"); } catch (e) {}
  ctx.submit("ok");
}
"#,
    )
    .unwrap();
    let lines: Vec<String> = (0..2)
        .map(|i| {
            serde_json::json!({
                "id": format!("h{i}"),
                "instruction": "x",
                "verify": "rm -f out.txt; sleep 1; test -e out.txt",
            })
            .to_string()
        })
        .collect();
    let tasks = env.write_tasks(&lines);
    let o = env.eval(&tasks, &["-j", "1", "--harness", dir.to_str().unwrap()]);
    let mut ids = std::collections::BTreeSet::new();
    for id in ["h0", "h1"] {
        let r = env.result(id);
        assert_eq!(r["status"], "failed", "{r}\n{}", text(&o));
        assert_eq!(r["sandbox"]["reused"], false, "{r}");
        ids.insert(r["sandbox"]["id"].to_string());
    }
    assert_eq!(ids.len(), 2);
    assert!(env.live_sandboxes().is_empty());
}

#[test]
fn a_separate_verifier_sees_the_workspace_and_nothing_else() {
    let agent = "echo 7 > out.txt; mkdir -p sub && printf 'a\\0b' > sub/bin; \
                 echo x > /tmp/agent-was-here; \
                 setsid sh -c 'while :; do echo x > /tmp/agent-alive; sleep 0.02; done' \
                 > /dev/null 2>&1 < /dev/null & echo ok";
    let line = |id: &str, verify: &str| {
        serde_json::json!({
            "id": id,
            "instruction": "x",
            "timeout_s": 30,
            "model_script": [
                {"tool_calls": [{"name": "bash", "arguments": {"command": agent}}]},
                {"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]},
            ],
            "verify": verify,
            "tests": {"t.sh": "test \"$(cat out.txt)\" = 7\n"},
        })
        .to_string()
    };
    let env = Env::new();
    let tasks = env.write_tasks(&[
        line(
            "copied",
            "sh /tests/t.sh && test \"$(od -An -c sub/bin | tr -d ' ')\" = 'a\\0b' && \
             sleep 0.5 && test ! -e /tmp/agent-was-here && test ! -e /tmp/agent-alive",
        ),
        line(
            "forged",
            "rm -f /tmp/agent-alive; sleep 1; test -e /tmp/agent-alive",
        ),
    ]);
    let o = env.eval(&tasks, &["-j", "1", "--verifier", "separate"]);
    assert_eq!(env.result("copied")["status"], "passed", "{}", text(&o));
    assert_eq!(env.result("forged")["status"], "failed", "{}", text(&o));
    assert!(env.live_sandboxes().is_empty());
}

/// The agent leaves a note in `/dev/shm` and a SysV shared memory segment, both outliving
/// its processes; as root the stop's sweep finds them and the verifier gets a fresh task
/// namespace, where neither is seen.
#[test]
fn the_verifier_sees_no_shared_memory_the_agent_left() {
    let agent = "echo 7 > /dev/shm/answer && \
                 python3 -c 'import ctypes; ctypes.CDLL(None).shmget(0x5EED, 4096, 0o1600)' && \
                 echo \"left $(ls /dev/shm) and $(tail -n +2 /proc/sysvipc/shm | wc -l) segment\"";
    let line = serde_json::json!({
        "id": "shm-note",
        "instruction": "x",
        "model_script": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": agent}}]},
            {"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]},
        ],
        "verify": "test -z \"$(ls -A /dev/shm)\" && test \"$(wc -l < /proc/sysvipc/shm)\" = 1",
    });
    let env = Env::new();
    let tasks = env.write_tasks(&[line.to_string()]);
    let o = env.eval(&tasks, &[]);
    let r = env.result("shm-note");
    assert_eq!(r["status"], "passed", "{r}\n{}", text(&o));
    let frames = serde_json::to_string(&transcript_frames(&env, "shm-note")).unwrap();
    assert!(frames.contains("left answer and 1 segment"), "{frames}");
}
