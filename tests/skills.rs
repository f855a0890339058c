//! `--skills DIR` end to end: the real binary, real local sandboxes, the real runners. The
//! system prompt lists each skill's name and description; `read_skill` brings a body, answered
//! by the host without reaching the environment or spending the tool budget; a bad skills
//! directory is refused by name before anything starts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

mod support;

use support::{share_pi_install, text, transcript_frames, Env};

/// What only the deploy skill's body says: seeing it proves the body arrived.
const MARKER: &str = "MARKER-5e1f0c";
const LISTING: [&str; 2] = [
    "- deploy: How to deploy the service safely.",
    "- review: How to review a change.",
];

fn deploy_body() -> String {
    format!("# Deploy\nCheck the build, then finish by submitting {MARKER}.\n")
}

/// A skills directory of two skills, `deploy` and `review`, in `env`.
fn write_skills(env: &Env) -> PathBuf {
    let dir = env.path("skills");
    std::fs::create_dir_all(&dir).unwrap();
    let deploy = format!(
        "---\nname: deploy\ndescription: How to deploy the service safely.\n---\n{}",
        deploy_body()
    );
    std::fs::write(dir.join("deploy.md"), deploy).unwrap();
    let review = "---\nname: review\ndescription: How to review a change.\n---\nREVIEW-BODY\n";
    std::fs::write(dir.join("review.md"), review).unwrap();
    dir
}

fn call(name: &str, args: Value) -> Value {
    json!({"tool_calls": [{"name": name, "arguments": args}]})
}

/// Reads the deploy skill, spends the only tool action, is refused a second one, asks for a
/// skill that does not exist, then submits the marker. Passes only if the second bash was
/// refused.
fn skilled_task() -> String {
    let script = json!([
        call("read_skill", json!({"name": "deploy"})),
        call("bash", json!({"command": "echo deployed > out.txt"})),
        call("bash", json!({"command": "echo again >> out.txt"})),
        call("read_skill", json!({"name": "nope"})),
        call("submit", json!({"answer": MARKER})),
    ]);
    json!({"id": "skilled", "instruction": "deploy the service",
           "verify": "test \"$(cat out.txt)\" = deployed", "model_script": script})
    .to_string()
}

/// Each tool request of a transcript with the host's reply: (name, arguments, reply).
fn tool_exchanges(frames: &[Value]) -> Vec<(String, Value, Value)> {
    frames
        .iter()
        .filter(|f| f["type"] == "tool_request")
        .map(|req| {
            let reply = frames
                .iter()
                .find(|f| f["type"] == "tool_response" && f["req_id"] == req["req_id"])
                .unwrap_or_else(|| panic!("no reply to {req}"));
            let name = req["name"].as_str().unwrap().to_string();
            (name, req["arguments"].clone(), reply.clone())
        })
        .collect()
}

/// The system prompt lists every skill by name and description, and holds no body.
fn assert_lists_without_bodies(system: &str) {
    for line in LISTING {
        assert!(system.contains(line), "{line:?} is not in {system:?}");
    }
    assert!(system.contains("read_skill"), "{system}");
    assert!(
        !system.contains(MARKER) && !system.contains("REVIEW-BODY"),
        "a body is in the system prompt: {system}"
    );
}

fn tool_names(tools: &Value) -> Vec<String> {
    tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect()
}

/// Whether any message of a chat-completions body is a tool result holding exactly `content`.
fn has_tool_message(body: &Value, content: &str) -> bool {
    body["messages"].as_array().is_some_and(|m| {
        m.iter()
            .any(|m| m["role"] == "tool" && m["content"] == content)
    })
}

/// Runs the skilled task with one tool action, under `harness`, and checks the record and
/// the transcript.
fn eval_with_skills(harness: &str) {
    let env = Env::new();
    if harness == "pi" {
        share_pi_install(&env);
    }
    let skills = write_skills(&env);
    let tasks = env.write_tasks(&[skilled_task()]);
    let o = env.eval(
        &tasks,
        &[
            "--skills",
            skills.to_str().unwrap(),
            "--max-tool-actions",
            "1",
            "--harness",
            harness,
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.result("skilled");
    assert_eq!(r["status"], "passed", "{r}");
    assert_eq!(r["answer"], MARKER, "{r}");
    assert_eq!(r["turns"], 5, "{r}");
    // The two bash calls (one refused); the reads are the host's, not tool calls.
    assert_eq!(r["tool_calls"], 2, "{r}");
    // The skills offered are part of what produced the result.
    let skills = r["provenance"]["skills"].as_str().unwrap_or_default();
    assert!(skills.starts_with("sha256:") && skills.len() == 71, "{r}");

    let frames = transcript_frames(&env, "skilled");
    let start = frames
        .iter()
        .find(|f| f["type"] == "episode_start")
        .unwrap();
    assert_eq!(start["harness"], harness);
    assert_lists_without_bodies(start["system"].as_str().unwrap());
    assert!(tool_names(&start["tools"]).contains(&"read_skill".to_string()));

    let ex = tool_exchanges(&frames);
    let names: Vec<&str> = ex.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["read_skill", "bash", "bash", "read_skill"],
        "{ex:?}"
    );
    let (_, args, reply) = &ex[0];
    assert_eq!(args["name"], "deploy");
    assert_eq!(reply["content"], deploy_body().as_str(), "{reply}");
    assert_eq!(reply["is_error"], false, "{reply}");
    let refused = &ex[2].2;
    assert_eq!(refused["is_error"], true, "{refused}");
    assert!(
        refused["content"]
            .as_str()
            .unwrap()
            .contains("budget exhausted"),
        "{refused}"
    );
    let unknown = &ex[3].2;
    assert_eq!(unknown["is_error"], true, "{unknown}");
    let says = unknown["content"].as_str().unwrap();
    assert!(says.starts_with("no skill named 'nope'"), "{says}");

    // What the model saw: the listing first, the body only after it asked.
    let bodies: Vec<&Value> = frames
        .iter()
        .filter(|f| f["type"] == "llm_request")
        .map(|f| &f["openai_body"])
        .collect();
    assert_eq!(bodies.len(), 5);
    let first = &bodies[0];
    assert_eq!(first["messages"][0]["role"], "system", "{first}");
    assert_lists_without_bodies(first["messages"][0]["content"].as_str().unwrap());
    assert!(tool_names(&first["tools"]).contains(&"read_skill".to_string()));
    assert!(!has_tool_message(first, &deploy_body()));
    assert!(
        has_tool_message(bodies[1], &deploy_body()),
        "the body never reached the model: {}",
        bodies[1]
    );
    assert!(
        env.live_sandboxes().is_empty(),
        "{:?}",
        env.live_sandboxes()
    );
}

#[test]
fn the_builtin_loop_reads_a_skill_without_spending_the_tool_budget() {
    eval_with_skills("builtin");
}

#[test]
fn the_pi_harness_reads_a_skill_without_spending_the_tool_budget() {
    eval_with_skills("pi");
}

/// One malformed skills directory: a good skill beside one bad entry, made by `bad`.
struct Malformed {
    entry: &'static str,
    says: &'static str,
    bad: fn(&Path),
}

fn malformed() -> Vec<Malformed> {
    fn put(dir: &Path, name: &str, text: &[u8]) {
        std::fs::write(dir.join(name), text).unwrap();
    }
    vec![
        Malformed {
            entry: "plain.md",
            says: "no front matter",
            bad: |d| put(d, "plain.md", b"# Just a body\n"),
        },
        Malformed {
            entry: "anon.md",
            says: "has no `name`",
            bad: |d| put(d, "anon.md", b"---\ndescription: d\n---\nbody\n"),
        },
        Malformed {
            entry: "wrong.md",
            says: "is not the file's name",
            bad: |d| put(d, "wrong.md", b"---\nname: right\ndescription: d\n---\n"),
        },
        Malformed {
            entry: "mute.md",
            says: "has no `description`",
            bad: |d| put(d, "mute.md", b"---\nname: mute\n---\nbody\n"),
        },
        Malformed {
            entry: "notes.txt",
            says: "is not a <name>.md file",
            bad: |d| put(d, "notes.txt", b"x"),
        },
        Malformed {
            entry: "nested",
            says: "is a directory",
            bad: |d| std::fs::create_dir(d.join("nested")).unwrap(),
        },
        Malformed {
            entry: "link.md",
            says: "is a symlink",
            bad: |d| std::os::unix::fs::symlink(d.join("good.md"), d.join("link.md")).unwrap(),
        },
        Malformed {
            entry: "latin1.md",
            says: "is not UTF-8",
            bad: |d| {
                put(
                    d,
                    "latin1.md",
                    b"---\nname: latin1\ndescription: caf\xe9\n---\n",
                )
            },
        },
        Malformed {
            entry: "huge.md",
            says: "is larger than 65536 bytes",
            bad: |d| {
                let body = "x".repeat(64 << 10);
                let text = format!("---\nname: huge\ndescription: d\n---\n{body}");
                put(d, "huge.md", text.as_bytes());
            },
        },
    ]
}

/// A fresh skills directory holding a good skill and `case`'s bad entry.
fn malformed_dir(env: &Env, i: usize, case: &Malformed) -> PathBuf {
    let dir = env.path(&format!("skills-{i}"));
    std::fs::create_dir(&dir).unwrap();
    let good = "---\nname: good\ndescription: fine\n---\nbody\n";
    std::fs::write(dir.join("good.md"), good).unwrap();
    (case.bad)(&dir);
    dir
}

#[test]
fn each_kind_of_malformed_skills_directory_is_refused_by_name_before_anything_starts() {
    let env = Env::new();
    let tasks = env.write_tasks(&[skilled_task()]);
    for (i, case) in malformed().iter().enumerate() {
        let dir = malformed_dir(&env, i, case);
        let o = env.eval(&tasks, &["--skills", dir.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{}: {}", case.entry, text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        let named = dir.join(case.entry).display().to_string();
        assert!(
            err.contains(&named) && err.contains(case.says),
            "{}: {err}",
            case.entry
        );
        assert!(!env.out().exists(), "{}: the run started", case.entry);
        assert!(env.live_sandboxes().is_empty(), "{}", case.entry);
    }
}

/// A chat-completions server playing an agent that reads the deploy skill, asks for one that
/// does not exist, writes the marker it found in the body, and submits it. Returns the
/// request bodies it saw.
fn serve_skill_reader(server: tiny_http::Server) -> std::thread::JoinHandle<Vec<Value>> {
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        while let Ok(Some(mut req)) = server.recv_timeout(Duration::from_secs(60)) {
            let mut body = String::new();
            std::io::Read::read_to_string(req.as_reader(), &mut body).unwrap();
            let body: Value = serde_json::from_str(&body).unwrap();
            seen.push(body.clone());
            let results: Vec<&str> = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "tool")
                .filter_map(|m| m["content"].as_str())
                .collect();
            // The marker as the first tool result (the skill's body) says it, if it does.
            let marker = results
                .first()
                .and_then(|r| r.split_whitespace().find(|w| w.starts_with("MARKER-")))
                .map_or("no marker", |w| w.trim_end_matches('.'));
            let (name, args) = match results.len() {
                0 => ("read_skill", json!({"name": "deploy"})),
                1 => ("read_skill", json!({"name": "nope"})),
                2 => (
                    "write_file",
                    json!({"path": "deployed.txt", "content": marker}),
                ),
                _ => ("submit", json!({"answer": marker})),
            };
            let reply = json!({
                "id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": null,
                    "tool_calls": [{"id": format!("call_{}", seen.len()), "type": "function",
                                    "function": {"name": name, "arguments": args.to_string()}}]}}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
            });
            let _ = req.respond(tiny_http::Response::from_string(reply.to_string()));
            if name == "submit" {
                break;
            }
        }
        seen
    })
}

#[test]
fn a_project_turn_reads_skills_answered_on_the_host() {
    let env = Env::new();
    let o = env.run(&["project", "create", "demo"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let run = |skills: &Path, base_url: &str, log: &Path| {
        env.cmd(&[
            "project",
            "run",
            "demo",
            "--instruction",
            "deploy the service",
        ])
        .args(["--model", "test-model", "--base-url", base_url])
        .args(["--api-key-env", "WMO_TEST_KEY", "--json", "--skills"])
        .arg(skills)
        .arg("--events")
        .arg(log)
        .env("WMO_TEST_KEY", "sk-test")
        .output()
        .unwrap()
    };

    // A bad directory is refused by name before the project's sandbox is touched: a lost
    // one is not even replaced.
    let sandbox_id = || {
        let o = env.run(&["project", "list", "--json"]);
        let list: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
        list[0]["sandbox_id"].as_str().unwrap().to_string()
    };
    let lost = sandbox_id();
    let o = env.run(&["sandbox", "kill", &lost]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let cases = malformed();
    let bad = malformed_dir(&env, 0, &cases[2]);
    let log = env.path("refused.jsonl");
    let o = run(&bad, "http://127.0.0.1:9/v1", &log);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&bad.join("wrong.md").display().to_string()),
        "{err}"
    );
    assert!(!log.exists(), "the turn started");
    assert_eq!(sandbox_id(), lost, "the project's sandbox was replaced");

    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let port = server.server_addr().to_ip().unwrap().port();
    let seen = serve_skill_reader(server);
    let log = env.path("events.jsonl");
    let base_url = format!("http://127.0.0.1:{port}/v1");
    let o = run(&write_skills(&env), &base_url, &log);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out: Value = serde_json::from_slice(&o.stdout).unwrap();
    let result = &out["result"];
    assert_eq!(result["answer"], MARKER, "{out}");
    assert_eq!(
        result["tool_calls"], 1,
        "only write_file is a tool call: {out}"
    );
    let o = env.run(&["project", "get", "demo", "deployed.txt"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), MARKER, "{}", text(&o));

    let events: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let results: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "tool_result")
        .map(|e| &e["payload"])
        .collect();
    assert_eq!(results.len(), 3, "{events:?}");
    assert_eq!(results[0]["name"], "read_skill");
    assert_eq!(results[0]["content"], deploy_body().as_str());
    assert_eq!(results[0]["is_error"], false);
    assert_eq!(results[1]["is_error"], true);
    let says = results[1]["content"].as_str().unwrap();
    assert!(says.starts_with("no skill named 'nope'"), "{says}");

    let bodies = seen.join().unwrap();
    assert_eq!(bodies.len(), 4);
    let system = &bodies[0]["messages"][0];
    assert_eq!(system["role"], "system", "{}", bodies[0]);
    assert_lists_without_bodies(system["content"].as_str().unwrap());
    assert!(tool_names(&bodies[0]["tools"]).contains(&"read_skill".to_string()));
    assert!(has_tool_message(&bodies[1], &deploy_body()));
}
