//! `wmo-e2b eval` with what drives an episode: an OpenAI-compatible model API (and what
//! happens when it refuses or is unreachable), a user harness, the pi harness, a world model.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use serde_json::Value;

mod support;

use support::{share_pi_install, task, text, transcript_frames, Env, SUBMIT};

/// A chat-completions server: the first request of each conversation gets a 500, then the
/// agent runs `env`, then submits. Returns the bodies it saw.
fn serve_chat(server: tiny_http::Server, key: &'static str) -> std::thread::JoinHandle<Vec<Value>> {
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut failed_once = false;
        while let Ok(Some(mut req)) = server.recv_timeout(Duration::from_secs(30)) {
            let auth = req
                .headers()
                .iter()
                .find(|h| h.field.equiv("Authorization"))
                .map(|h| h.value.as_str().to_string());
            let mut body = String::new();
            std::io::Read::read_to_string(req.as_reader(), &mut body).unwrap();
            let body: Value = serde_json::from_str(&body).unwrap();
            seen.push(body.clone());
            if auth.as_deref() != Some(&format!("Bearer {key}")) {
                let _ = req.respond(tiny_http::Response::from_string("{}").with_status_code(401));
                continue;
            }
            if !failed_once {
                failed_once = true;
                let _ = req.respond(tiny_http::Response::from_string("oops").with_status_code(500));
                continue;
            }
            let has_tool_result = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["role"] == "tool");
            let (name, args) = if has_tool_result {
                ("submit", r#"{"answer":"done"}"#)
            } else {
                ("bash", r#"{"command":"env"}"#)
            };
            let reply = serde_json::json!({
                "id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": null,
                    "tool_calls": [{"id": "call_1", "type": "function",
                                    "function": {"name": name, "arguments": args}}]}}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
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
fn an_openai_compatible_model_drives_the_episode_and_its_key_stays_on_the_host() {
    const KEY: &str = "sk-test-a8f3e1c9d2b74f06";
    let env = Env::new();
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let port = server.server_addr().to_ip().unwrap().port();
    let seen = serve_chat(server, KEY);
    let tasks = env.write_tasks(&[task("real", "")]);
    let base = format!("http://127.0.0.1:{port}/v1");
    let o = eval_against(&env, &tasks, &base, KEY, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.result("real");
    assert_eq!(r["status"], "passed", "{r}");
    assert_eq!(r["answer"], "done");
    assert_eq!(r["retries"]["provider"], 1, "{r}");
    assert_eq!(r["tokens"]["input"], 22, "{r}");
    assert_eq!(r["tokens"]["calls"], 2, "{r}");
    let transcript = std::fs::read_to_string(env.out().join("transcripts/real.jsonl")).unwrap();
    assert!(transcript.contains("HOME="), "the env tool call ran");
    assert!(!transcript.contains(KEY), "the API key reached the sandbox");
    let bodies = seen.join().unwrap();
    assert_eq!(bodies.len(), 3);
    assert!(bodies.iter().all(|b| b["model"] == "test-model"));
    assert!(bodies[0]["tools"].as_array().unwrap().len() >= 4);

    // A missing key is a usage error naming the variable, before any sandbox starts.
    let o = env.run(&[
        "eval",
        "--tasks",
        tasks.to_str().unwrap(),
        "--model",
        "m",
        "--api-key-env",
        "WMO_NO_SUCH_KEY",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("WMO_NO_SUCH_KEY"));
    assert!(env.live_sandboxes().is_empty());
}

/// A chat-completions server that answers every request with one status, until dropped.
struct RefusingServer {
    base_url: String,
    hits: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RefusingServer {
    fn start(status: u16) -> RefusingServer {
        use std::sync::atomic::Ordering;
        let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
        let port = server.server_addr().to_ip().unwrap().port();
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (h, s) = (hits.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                if let Ok(Some(req)) = server.recv_timeout(Duration::from_millis(100)) {
                    h.fetch_add(1, Ordering::SeqCst);
                    let body = r#"{"error": {"message": "refused by the test server"}}"#;
                    let reply = tiny_http::Response::from_string(body).with_status_code(status);
                    let _ = req.respond(reply);
                }
            }
        });
        RefusingServer {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            hits,
            stop,
            thread: Some(thread),
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for RefusingServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `eval` of `tasks` with the OpenAI provider at `base_url`, its key `key` in WMO_TEST_KEY.
fn eval_against(env: &Env, tasks: &Path, base_url: &str, key: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "--model",
        "test-model",
        "--base-url",
        base_url,
        "--api-key-env",
        "WMO_TEST_KEY",
    ];
    args.extend_from_slice(extra);
    env.eval_cmd(tasks, &args)
        .env("WMO_TEST_KEY", key)
        .output()
        .unwrap()
}

#[test]
fn a_refused_key_or_an_unknown_model_stops_the_run_and_scores_nothing() {
    // Every task would pass its verify without the agent doing anything.
    let lines: Vec<String> = (0..6)
        .map(|i| {
            task(
                &format!("t{i}"),
                &format!(r#""verify": "true", "model_script": [{SUBMIT}]"#),
            )
        })
        .collect();
    for (status, option) in [
        (401, "--api-key-env"),
        (403, "--api-key-env"),
        (404, "--model"),
    ] {
        let env = Env::new();
        let tasks = env.write_tasks(&lines);
        let server = RefusingServer::start(status);
        let o = eval_against(&env, &tasks, &server.base_url, "sk-test", &["-j", "2"]);
        assert_eq!(o.status.code(), Some(3), "HTTP {status}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("stopped early"), "{err}");
        assert!(err.contains(option), "HTTP {status}: {err}");
        if status != 404 {
            assert!(err.contains("WMO_TEST_KEY"), "{err}");
        }
        // Only the tasks already running when the first refusal came were written, and
        // none of them was scored.
        let results = env.results();
        assert!(!results.is_empty() && results.len() <= 2, "{results:?}");
        for r in &results {
            assert!(r["status"] == "error" || r["status"] == "cancelled", "{r}");
            assert!(r["verify"].is_null(), "verify ran: {r}");
            if r["status"] == "error" {
                assert_eq!(r["stop_reason"], "provider_error", "{r}");
                assert!(r["error"].as_str().unwrap().contains(option), "{r}");
            }
        }
        // One refusal per task at most: the refused key is never retried.
        assert!(server.hits() <= 2, "{} requests", server.hits());
        assert!(env.live_sandboxes().is_empty());

        // --resume runs every task again: none of them finished.
        let o = env.eval(&tasks, &["--resume"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let passed = env
            .results()
            .into_iter()
            .filter(|r| r["status"] == "passed")
            .count();
        assert_eq!(passed, 6, "{:?}", env.results());
    }
}

#[test]
fn an_unreachable_model_api_is_an_error_with_its_retries_counted_and_resume_reruns_it() {
    let env = Env::new();
    // Bind and drop to find a port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tasks = env.write_tasks(&[task(
        "offline",
        &format!(r#""verify": "true", "model_script": [{SUBMIT}]"#),
    )]);
    let o = eval_against(
        &env,
        &tasks,
        &format!("http://127.0.0.1:{port}/v1"),
        "sk-test",
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r = env.result("offline");
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(r["stop_reason"], "provider_error", "{r}");
    assert!(r["verify"].is_null(), "verify ran without a model: {r}");
    let error = r["error"].as_str().unwrap();
    assert!(error.contains("gave up after 5 attempts"), "{r}");
    assert!(error.contains("could not be reached"), "{r}");
    assert_eq!(r["retries"]["provider"], 4, "{r}");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(env.out().join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["errors"], 1, "{summary}");
    assert_eq!(summary["provider_retries"], 4, "{summary}");

    let o = env.eval(&tasks, &["--resume"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let results = env.results();
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(results[1]["status"], "passed", "{results:?}");
}

#[test]
fn a_user_harness_directory_runs_instead_of_the_builtin_loop() {
    let env = Env::new();
    let dir = env.path("harness");
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    std::fs::write(
        dir.join("agent.mjs"),
        r#"import { tag } from "./lib/tag.mjs";
export async function runEpisode(ctx) {
  ctx.log("harness " + tag + " starting on " + ctx.taskId);
  const r = await ctx.tool("bash", { command: "echo from-harness > h.txt && cat h.txt" });
  const c = await ctx.llm({ messages: [{ role: "user", content: ctx.instruction }], tools: ctx.tools });
  ctx.submit(r.content.trim() + "|" + (c.choices[0].message.content || ""));
}
"#,
    )
    .unwrap();
    std::fs::write(dir.join("lib/tag.mjs"), "export const tag = 'v1';\n").unwrap();
    let tasks = env.write_tasks(&[task(
        "custom",
        r#""verify": "test -f h.txt", "model_script": [{"content": "hi"}]"#,
    )]);
    let o = env.eval(&tasks, &["--harness", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.result("custom");
    assert_eq!(r["status"], "passed", "{r}");
    assert_eq!(r["answer"], "from-harness|hi", "{r}");
    let frames = transcript_frames(&env, "custom");
    let start = frames
        .iter()
        .find(|f| f["type"] == "episode_start")
        .unwrap();
    assert_eq!(start["harness"], "user");
    // The transcript notes the harness files instead of copying them every episode.
    assert_eq!(start["files"]["count"], 2, "{start}");
    assert!(start["files"]["paths"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!("lib/tag.mjs")));
    assert!(frames
        .iter()
        .any(|f| f["type"] == "log" && f["message"] == "harness v1 starting on custom"));

    // A harness directory that is not a plain tree is refused by name.
    std::os::unix::fs::symlink("/etc/hostname", dir.join("lib/link")).unwrap();
    let o = env.eval(&tasks, &["--harness", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("lib/link") && err.contains("symlink"), "{err}");
}

/// A user's harness runs in the runner itself, whose memory no reset can prove clean: every
/// task gets a fresh runner (its sandbox is never reused), which is sent the files.
#[test]
fn a_user_harness_never_shares_a_runner() {
    let env = Env::new();
    let dir = env.path("harness");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("agent.mjs"),
        "export async function runEpisode(ctx) { ctx.submit('ok ' + ctx.taskId); }\n",
    )
    .unwrap();
    let lines: Vec<String> = (0..3).map(|i| task(&format!("t{i}"), "")).collect();
    let tasks = env.write_tasks(&lines);
    let h = dir.to_str().unwrap();
    let o = env.eval(&tasks, &["-j", "1", "--harness", h]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let start = |id: &str| -> serde_json::Value {
        transcript_frames(&env, id)
            .into_iter()
            .find(|f| f["type"] == "episode_start")
            .unwrap()
    };
    let mut digests = std::collections::BTreeSet::new();
    let mut sandboxes = std::collections::BTreeSet::new();
    for id in ["t0", "t1", "t2"] {
        let s = start(id);
        let r = env.result(id);
        assert_eq!(r["answer"], format!("ok {id}"));
        assert_eq!(r["sandbox"]["reused"], false, "{r}");
        sandboxes.insert(r["sandbox"]["id"].as_str().unwrap().to_string());
        digests.insert(s["files_digest"].as_str().unwrap().to_string());
        assert_eq!(s["files"]["count"], 1, "{s}");
    }
    assert_eq!(sandboxes.len(), 3);
    assert_eq!(digests.len(), 1);

    // Without reuse every task has a fresh runner, which is sent the files.
    let env2 = Env::new();
    let tasks = env2.write_tasks(&lines);
    let o = env2.eval(&tasks, &["-j", "1", "--no-reuse", "--harness", h]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    for id in ["t0", "t1", "t2"] {
        let s = transcript_frames(&env2, id)
            .into_iter()
            .find(|f| f["type"] == "episode_start")
            .unwrap();
        assert_eq!(s["files"]["count"], 1, "{s}");
    }
}

#[test]
fn a_lone_surrogate_from_a_harness_reaches_the_host_as_a_replacement_character() {
    let env = Env::new();
    let dir = env.path("harness");
    std::fs::create_dir_all(&dir).unwrap();
    // Half of a surrogate pair: JSON.stringify writes it as a lone "\ud83d" escape in the
    // log, the tool request and the done frame alike.
    std::fs::write(
        dir.join("agent.mjs"),
        r#"export async function runEpisode(ctx) {
  const half = "\u{1F680}".slice(0, 1);
  ctx.log("half " + half);
  const r = await ctx.tool("bash", { command: "printf %s '" + half + "' | wc -c" });
  ctx.submit("got " + half + "|" + r.content.trim());
}
"#,
    )
    .unwrap();
    // The timeout only bounds the failure this test guards against (a dropped frame leaves
    // the episode waiting for its wall budget).
    let tasks = env.write_tasks(&[task("half", r#""timeout_s": 30"#)]);
    let o = env.eval(&tasks, &["--harness", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.result("half");
    assert_eq!(r["status"], "passed", "{r}");
    assert_eq!(r["stop_reason"], "submit", "{r}");
    // U+FFFD is three bytes of UTF-8, and that is what the bash tool call printed.
    assert_eq!(r["answer"], "got \u{FFFD}|3", "{r}");
    let frames = transcript_frames(&env, "half");
    assert!(
        frames
            .iter()
            .any(|f| f["type"] == "log" && f["message"] == "half \u{FFFD}"),
        "{frames:?}"
    );
}

#[test]
fn a_world_model_answers_tool_calls_and_nothing_runs_in_the_sandbox() {
    let env = Env::new();
    let marker = env.path("must-not-exist");
    let bash = serde_json::json!({"tool_calls": [{"name": "bash",
        "arguments": {"command": format!("touch {} && cat in.txt", marker.display())}}]});
    let tasks = env.write_tasks(&[task(
        "simulated",
        &format!(
            r#""files": {{"in.txt": "3 4"}}, "verify": "false", "model_script": [{bash}, {SUBMIT}], "world_script": [{{"content": "3 4 (simulated)"}}]"#
        ),
    )]);
    let o = env.eval(&tasks, &["--env", "world-model"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.result("simulated");
    assert_eq!(r["status"], "passed", "{r}");
    assert!(
        r["verify"].is_null(),
        "verify ran in a simulated environment: {r}"
    );
    assert!(!marker.exists(), "a tool call ran for real");
    let frames = transcript_frames(&env, "simulated");
    let reply = frames
        .iter()
        .find(|f| f["type"] == "tool_response")
        .unwrap();
    assert_eq!(reply["content"], "3 4 (simulated)");
    assert_eq!(reply["is_error"], false);
}

#[test]
fn the_pi_harness_runs_episodes_end_to_end() {
    let env = Env::new();
    share_pi_install(&env);
    let bash =
        r#"{"tool_calls": [{"name": "bash", "arguments": {"command": "echo 7 > out.txt"}}]}"#;
    let tasks = env.write_tasks(&[
        task(
            "pi-submit",
            &format!(
                r#""verify": "test \"$(cat out.txt)\" = 7", "model_script": [{bash}, {SUBMIT}]"#
            ),
        ),
        task(
            "pi-turns",
            &format!(r#""max_turns": 2, "model_script": [{bash}, {bash}, {bash}]"#),
        ),
        task(
            "pi-provider",
            r#""model_script": [{"error": "upstream exploded"}]"#,
        ),
    ]);
    let o = env.eval(&tasks, &["--harness", "pi", "-j", "3"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let r = env.result("pi-submit");
    assert_eq!(r["status"], "passed", "{r}");
    assert_eq!(r["answer"], "ok");
    assert_eq!(r["turns"], 2, "{r}");
    let r = env.result("pi-turns");
    assert_eq!(r["stop_reason"], "max_turns", "{r}");
    let r = env.result("pi-provider");
    assert_eq!(r["stop_reason"], "provider_error", "{r}");
    let start = transcript_frames(&env, "pi-submit")
        .into_iter()
        .find(|f| f["type"] == "episode_start")
        .unwrap();
    assert_eq!(start["harness"], "pi");
    // provenance names the one file the sandboxes ran
    let bundle = wmo_e2b::runner::pi::find_installed(&env.home())
        .unwrap()
        .unwrap()
        .bundle;
    let p = &env.result("pi-submit")["provenance"];
    assert_eq!(
        p["harness"],
        format!("pi@{}", wmo_e2b::runner::pi::PI_VERSION)
    );
    assert_eq!(p["harness_digest"], bundle.digest(), "{p}");
    assert!(env.live_sandboxes().is_empty());
}
