//! `wmo-e2b eval` refusing what it cannot run, before any sandbox starts or without losing
//! what finished: bad tasks files and options, a missing Node.js, an --out in use, results
//! that cannot be written.

use std::time::Duration;

use serde_json::Value;

mod support;

use support::{task, text, transcript_frames, wait_bounded, wait_for, Env, SUBMIT};

#[test]
fn malformed_tasks_are_rejected_before_any_sandbox_starts() {
    let env = Env::new();
    let cases = [
        ("{\"id\": \"a\", \"instruction\": \"x\"}\n{oops\n", ":2:"),
        ("{\"id\": \"a\"}\n", "instruction"),
        (
            "{\"id\": \"a\", \"instruction\": \"x\"}\n{\"id\": \"a\", \"instruction\": \"y\"}\n",
            "duplicate",
        ),
        (
            "{\"id\": \"a\", \"instruction\": \"x\", \"max_turns\": \"many\"}\n",
            "max_turns",
        ),
    ];
    for (content, needle) in cases {
        let p = env.path("bad.jsonl");
        std::fs::write(&p, content).unwrap();
        let o = env.eval(&p, &[]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("bad.jsonl"), "{err}");
        assert!(err.contains(needle), "{needle}: {err}");
        assert!(env.live_sandboxes().is_empty());
    }
    let o = env.run(&["eval", "--tasks", "x.jsonl", "--backend", "cloud9"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = env.run(&["eval", "--tasks", "missing.jsonl"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.jsonl"));
}

#[test]
fn an_out_that_is_a_file_is_a_usage_error() {
    let env = Env::new();
    let tasks = env.write_tasks(&[task("ok", &format!(r#""model_script": [{SUBMIT}]"#))]);
    let file = env.path("a-file");
    std::fs::write(&file, "mine").unwrap();
    let o = env.run(&[
        "eval",
        "--tasks",
        tasks.to_str().unwrap(),
        "--out",
        file.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("not a directory"), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
    assert!(env.live_sandboxes().is_empty());
}

#[test]
fn task_files_that_cannot_all_be_written_are_refused_at_load() {
    let env = Env::new();
    let tasks = env.write_tasks(&[
        task("ok", &format!(r#""model_script": [{SUBMIT}]"#)),
        task("nested", r#""files": {"a": "1", "a/b": "2"}"#),
        task("same", r#""files": {"a": "1", "./a": "2"}"#),
    ]);
    let o = env.eval(&tasks, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("tasks.jsonl:2: field `files`"), "{err}");
    assert!(err.contains("tasks.jsonl:3: field `files`"), "{err}");
    assert!(env.live_sandboxes().is_empty());
    assert!(env.results().is_empty());
}

#[test]
fn a_task_file_the_sandbox_refuses_is_the_tasks_error_not_a_replay() {
    let env = Env::new();
    // Longer than any file name may be: the sandbox refuses the write itself (a bad request,
    // not a transport failure), on this sandbox or any other.
    let long = "n".repeat(300);
    let tasks = env.write_tasks(&[task(
        "long",
        &format!(r#""files": {{"{long}": "x"}}, "model_script": [{SUBMIT}]"#),
    )]);
    let o = env.eval(&tasks, &["--transport-retries", "2"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r = env.result("long");
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(r["attempts"], 1, "{r}");
    assert_eq!(r["retries"]["transport"], 0, "{r}");
    let error = r["error"].as_str().unwrap();
    assert!(error.contains("writing task files"), "{r}");
    let state = env.home();
    for host_path in [state.clone(), state.canonicalize().unwrap()] {
        let host_path = host_path.to_str().unwrap().to_string();
        assert!(!error.contains(&host_path), "{host_path} in {error}");
    }
    assert!(env.live_sandboxes().is_empty());
}

#[test]
fn help_lists_the_exit_codes() {
    let env = Env::new();
    let o = env.run(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
    let help = String::from_utf8_lossy(&o.stdout);
    for line in [
        "Exit codes:",
        "  0 ",
        "  1 ",
        "  2 ",
        "  3 ",
        "  4 ",
        "  130 ",
    ] {
        assert!(help.contains(line), "no {line:?} in:\n{help}");
    }
}

#[test]
fn out_of_range_durations_and_rates_exit_2_before_any_sandbox() {
    let env = Env::new();
    let tasks = env.write_tasks(&[task("a", &format!(r#""model_script": [{SUBMIT}]"#))]);
    let huge = "500000000000years";
    let mut cases: Vec<(&str, &str)> = vec![
        ("--episode-timeout", huge),
        ("--episode-timeout", "0s"),
        ("--bash-timeout", huge),
        ("--hello-timeout", huge),
        ("--request-timeout", huge),
        ("--request-timeout", "8d"),
    ];
    for rate in ["1e-300", "NaN", "inf", "0", "-1"] {
        cases.push(("--create-rate", rate));
    }
    for (option, value) in cases {
        // `=` so that a negative value is not read as an option.
        let o = env.eval(&tasks, &[&format!("{option}={value}")]);
        assert_eq!(o.status.code(), Some(2), "{option} {value}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(option), "{option} {value}: {err}");
        let range = if option == "--create-rate" {
            "from 0.01 to 1000"
        } else {
            "from 1s to 7days"
        };
        assert!(err.contains(range), "{option} {value}: {err}");
    }
    let o = env.run(&["reap", "--dry-run", "--older-than", huge]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--older-than"));

    assert!(
        env.live_sandboxes().is_empty(),
        "{:?}",
        env.live_sandboxes()
    );
    let leases = std::fs::read_dir(env.home().join("leases"))
        .map(|rd| rd.count())
        .unwrap_or(0);
    assert_eq!(leases, 0, "a sandbox was leased");
    assert!(env.results().is_empty());
}

#[test]
fn a_second_eval_on_the_same_out_is_refused_and_the_first_finishes_intact() {
    let env = Env::new();
    let slow =
        r#"{"delay_ms": 3000, "tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]}"#;
    let lines: Vec<String> = (0..4)
        .map(|i| task(&format!("t{i}"), &format!(r#""model_script": [{slow}]"#)))
        .collect();
    let tasks = env.write_tasks(&lines);
    let mut first = env.spawn_eval(&tasks, &["-j", "2"]);
    // The first run is under way once it made its transcripts directory.
    let pid = first.id().to_string();
    wait_for("the first eval to start", Duration::from_secs(60), || {
        assert!(
            first.try_wait().unwrap().is_none(),
            "the first eval ended early"
        );
        env.out().join("transcripts").exists()
    });

    let o = env.eval(&tasks, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("pid {pid}")), "{err}");

    let status = wait_bounded(&mut first, Duration::from_secs(120));
    assert_eq!(status.code(), Some(0));
    let results = env.results();
    let mut ids: Vec<&str> = results.iter().map(|r| r["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["t0", "t1", "t2", "t3"], "{results:?}");
    assert!(
        results.iter().all(|r| r["status"] == "passed"),
        "{results:?}"
    );
    for id in ids {
        let starts = transcript_frames(&env, id)
            .iter()
            .filter(|f| f["type"] == "episode_start")
            .count();
        assert_eq!(starts, 1, "{id}");
    }
}

#[test]
fn results_that_cannot_be_written_stop_the_run_with_exit_3() {
    use std::os::unix::process::CommandExt;
    // Files this eval may grow to at most (RLIMIT_FSIZE): the runner and transcripts fit,
    // results.jsonl, already nearly this big, does not.
    const LIMIT: usize = 1 << 20;
    let env = Env::new();
    let lines: Vec<String> = (0..3)
        .map(|i| task(&format!("t{i}"), &format!(r#""model_script": [{SUBMIT}]"#)))
        .collect();
    let tasks = env.write_tasks(&lines);
    let out = env.out();
    std::fs::create_dir_all(&out).unwrap();
    let frame = r#"{"id":"old","status":"passed","pad":""}"#.len() + 1;
    let old = format!(
        "{{\"id\":\"old\",\"status\":\"passed\",\"pad\":\"{}\"}}\n",
        "x".repeat(LIMIT - 10 - frame)
    );
    std::fs::write(out.join("results.jsonl"), &old).unwrap();

    let mut cmd = env.eval_cmd(&tasks, &["-j", "1", "--json"]);
    // SAFETY: setrlimit and signal are async-signal-safe, as pre_exec requires. With
    // SIGXFSZ ignored, a write past the limit fails with EFBIG instead of killing the child.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: LIMIT as libc::rlim_t,
                rlim_max: LIMIT as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let o = cmd.output().unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let events: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    assert!(
        events.iter().any(|e| e["type"] == "results_failed"),
        "{stdout}"
    );
    let last = events.last().unwrap();
    assert_eq!(last["type"], "summary", "{stdout}");
    let fatal = last["summary"]["fatal"].as_str().unwrap_or_default();
    assert!(fatal.contains("cannot append to results file"), "{stdout}");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["fatal"], last["summary"]["fatal"], "{summary}");
    // The run stopped scheduling after the failed write.
    assert!(summary["not_run"].as_u64().unwrap() >= 1, "{summary}");
    let results = std::fs::read(out.join("results.jsonl")).unwrap();
    assert_eq!(results.len(), LIMIT);
    assert!(results.starts_with(old.as_bytes()));
    assert!(env.live_sandboxes().is_empty());
}

/// A PATH holding every tool of /usr/bin and /bin except `node`, plus `extra` scripts.
fn path_without_node(env: &Env, extra: &[(&str, &str)]) -> String {
    let bin = env.path("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for dir in ["/usr/bin", "/bin"] {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let name = entry.file_name();
            let link = bin.join(&name);
            if name == "node" || link.exists() {
                continue;
            }
            let _ = std::os::unix::fs::symlink(entry.path(), link);
        }
    }
    for (name, body) in extra {
        let p = bin.join(name);
        std::fs::write(&p, body).unwrap();
        let mut perm = std::fs::metadata(&p).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
        std::fs::set_permissions(&p, perm).unwrap();
    }
    bin.display().to_string()
}

#[test]
fn missing_or_old_node_stops_the_run_with_a_clear_error() {
    let env = Env::new();
    let lines: Vec<String> = (0..6)
        .map(|i| task(&format!("t{i}"), &format!(r#""model_script": [{SUBMIT}]"#)))
        .collect();
    let tasks = env.write_tasks(&lines);
    // Unconfined, the caller's PATH is the sandbox's; under bwrap the system directories
    // always hold this machine's own node.
    let path = path_without_node(&env, &[]);
    let o = env
        .eval_cmd(&tasks, &["--isolation", "none"])
        .env("PATH", &path)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("Node.js is not installed"), "{err}");
    assert!(err.contains(">= 18"), "{err}");
    // It stopped instead of failing every task the same way.
    assert!(env.results().len() < 6, "{:?}", env.results());
    assert!(env.live_sandboxes().is_empty());

    // A node outside the system directories is bound into the sandbox where it is.
    std::fs::remove_dir_all(env.out()).unwrap();
    let old = "#!/bin/sh\necho 'wmo-e2b runner needs Node.js >= 18 (found v16.20.0)' >&2\nexit 3\n";
    let path = path_without_node(&env, &[("node", old)]);
    let o = env
        .eval_cmd(&tasks, &[])
        .env("PATH", &path)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("too old"), "{err}");
    assert!(err.contains("v16.20.0"), "{err}");
    assert!(env.live_sandboxes().is_empty());
}

/// A task runs from the line that was checked, or not at all: a tasks file changed under a
/// run stops it, naming the line, instead of running something never checked.
#[test]
fn a_tasks_file_changed_under_the_run_stops_it_by_name() {
    let env = Env::new();
    let slow = task(
        "slow",
        &format!(
            r#""files": {{"started": "1"}}, "model_script": [{{"delay_ms": 1500, "content": "thinking"}}, {SUBMIT}]"#
        ),
    );
    let next = task("next", &format!(r#""model_script": [{SUBMIT}]"#));
    let tasks = env.write_tasks(&[slow, next]);
    let child = env
        .eval_cmd(&tasks, &["-j", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the first task to start", Duration::from_secs(30), || {
        env.sandbox_with("started").is_some()
    });
    let text = std::fs::read_to_string(&tasks).unwrap();
    std::fs::write(&tasks, text.replace("\"next\"", "\"edited\"")).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2") && err.contains("\"next\""), "{err}");
    assert_eq!(env.result("slow")["status"], "passed");
    assert!(env
        .results()
        .iter()
        .all(|r| r["id"] != "next" && r["id"] != "edited"));
}
