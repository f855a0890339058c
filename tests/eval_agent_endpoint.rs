//! `eval --harness agent:NAME | cmd:COMMAND`: agents run as processes of the task, their model
//! calls served by the runner's endpoint and answered on the host. The real agents are
//! installed from their npm packages (once, under `target/agent-cache`) and driven by a
//! scripted model in their own tool vocabulary; the host's keys never reach the sandbox.

use std::path::Path;

use serde_json::{json, Value};

mod support;

use support::{text, transcript_frames, Env};

/// What the host holds and no sandbox may: set in the eval's own environment.
const HOST_SECRET: &str = "sk-host-secret-7f3a9c2e51d84b60";

/// Shares one install of each agent between tests, as `share_pi_install` does for pi.
fn share_agent_installs(env: &Env) {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/agent-cache");
    std::fs::create_dir_all(cache.join("agents")).unwrap();
    std::fs::create_dir_all(env.home()).unwrap();
    std::os::unix::fs::symlink(cache.join("agents"), env.home().join("agents")).unwrap();
}

/// `eval` of `lines` with `harness`, the host's keys set to [`HOST_SECRET`].
fn eval_with(env: &Env, lines: &[Value], harness: &str, extra: &[&str]) -> std::process::Output {
    let lines: Vec<String> = lines.iter().map(Value::to_string).collect();
    let tasks = env.write_tasks(&lines);
    let mut args = vec!["--harness", harness];
    args.extend(extra);
    env.eval_cmd(&tasks, &args)
        .env("OPENAI_API_KEY", HOST_SECRET)
        .env("ANTHROPIC_API_KEY", HOST_SECRET)
        .output()
        .unwrap()
}

/// A verify that passes only when `out.txt` holds 7 and nothing the agent could see (its
/// environment, its processes, its files) holds the host's key.
fn verify_sum_and_no_key() -> String {
    format!("test \"$(cat out.txt)\" = 7 && ! grep -q {HOST_SECRET} seen.txt && ! grep -rqs {HOST_SECRET} /home/user /tmp")
}

/// The step, in any agent's shell tool, that keeps what the agent could see.
const LOOK_AROUND: &str = "env > seen.txt; ps -eo args >> seen.txt; cat in.txt";

fn api_requests(env: &Env, id: &str) -> Vec<Value> {
    transcript_frames(env, id)
        .into_iter()
        .filter(|f| f["type"] == "llm_request")
        .collect()
}

#[test]
fn claude_code_from_its_package_solves_a_scripted_task_without_the_key() {
    let env = Env::new();
    share_agent_installs(&env);
    let bash = |command: &str| json!({"tool_calls": [{"name": "Bash", "arguments": {"command": command, "description": "step"}}]});
    let task = json!({
        "id": "cc", "instruction": "Write the sum of the numbers in in.txt to out.txt.",
        "files": {"in.txt": "3 4"}, "verify": verify_sum_and_no_key(),
        "model_script": [bash(LOOK_AROUND), bash("echo $((3 + 4)) > out.txt"), {"content": "Done."}],
    });
    let o = eval_with(&env, &[task], "agent:claude-code", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.result("cc");
    assert_eq!(r["status"], "passed", "{r}");
    assert_eq!(r["stop_reason"], "agent_exit", "{r}");
    assert_eq!(r["turns"], 3, "{r}");
    let calls = api_requests(&env, "cc");
    assert_eq!(calls.len(), 3);
    for call in &calls {
        assert_eq!(call["api"], "anthropic_messages", "{call}");
        assert_eq!(call["api_body"]["stream"], true);
    }
    // The second call carries the first tool's result: the agent ran it in the sandbox.
    let history = calls[1]["api_body"]["messages"].to_string();
    assert!(
        history.contains("tool_result") && history.contains("3 4"),
        "{history}"
    );
    // The trajectory shows the agent's model calls as steps, its tool calls in its own words.
    let atif = env.path("atif");
    let o = env.run(&[
        "report",
        env.out().to_str().unwrap(),
        "--atif",
        atif.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let trajectory: Value =
        serde_json::from_str(&std::fs::read_to_string(atif.join("cc.json")).unwrap()).unwrap();
    let agent_steps: Vec<&Value> = trajectory["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["source"] == "agent")
        .collect();
    assert_eq!(agent_steps.len(), 3, "{trajectory}");
    assert_eq!(
        agent_steps[0]["tool_calls"][0]["function_name"], "Bash",
        "{trajectory}"
    );
    let provenance = r["provenance"].to_string();
    assert!(
        provenance.contains("agent:claude-code@2.1.332"),
        "{provenance}"
    );
    assert!(provenance.contains("sha512-"), "{provenance}");
}

#[test]
fn codex_from_its_package_solves_a_scripted_task_without_the_key() {
    let env = Env::new();
    share_agent_installs(&env);
    let shell =
        |cmd: &str| json!({"tool_calls": [{"name": "exec_command", "arguments": {"cmd": cmd}}]});
    let task = json!({
        "id": "codex", "instruction": "Write the sum of the numbers in in.txt to out.txt.",
        "files": {"in.txt": "3 4"}, "verify": verify_sum_and_no_key(),
        "model_script": [shell(LOOK_AROUND), shell("echo $((3 + 4)) > out.txt"), {"content": "Done."}],
    });
    let o = eval_with(&env, &[task], "agent:codex", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.result("codex");
    assert_eq!(r["status"], "passed", "{r}");
    assert_eq!(r["stop_reason"], "agent_exit", "{r}");
    let calls = api_requests(&env, "codex");
    assert_eq!(calls.len(), 3);
    assert!(calls.iter().all(|c| c["api"] == "openai_responses"));
    let history = calls[1]["api_body"]["input"].to_string();
    assert!(
        history.contains("function_call_output") && history.contains("3 4"),
        "{history}"
    );
}

#[test]
fn mini_swe_agent_from_its_package_solves_a_scripted_task_without_the_key() {
    let env = Env::new();
    share_agent_installs(&env);
    let bash = |command: &str| json!({"tool_calls": [{"name": "bash", "arguments": {"command": command}}]});
    let task = json!({
        "id": "mini", "instruction": "Write the sum of the numbers in in.txt to out.txt.",
        "files": {"in.txt": "3 4"}, "verify": verify_sum_and_no_key(),
        "model_script": [
            bash(LOOK_AROUND),
            bash("echo $((3 + 4)) > out.txt"),
            bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
        ],
    });
    let o = eval_with(&env, &[task], "agent:mini-swe-agent", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = env.result("mini");
    assert_eq!(r["status"], "passed", "{r}");
    assert_eq!(r["stop_reason"], "agent_exit", "{r}");
    let calls = api_requests(&env, "mini");
    assert_eq!(calls.len(), 3);
    assert!(calls.iter().all(|c| c["api"] == "openai_chat"));
    let history = calls[1]["api_body"]["messages"].to_string();
    assert!(history.contains("3 4"), "{history}");
    let provenance = r["provenance"].to_string();
    assert!(
        provenance.contains("agent:mini-swe-agent@2.4.6"),
        "{provenance}"
    );
    assert!(provenance.contains("sha256:"), "{provenance}");
}

/// A small agent of our own, in Python's standard library: it checks what the endpoint
/// answers (and refuses), then does the task through the OpenAI chat API.
const PROBE_AGENT: &str = r#"
import json, os, urllib.request, urllib.error
base = os.environ["OPENAI_BASE_URL"]
key = os.environ["OPENAI_API_KEY"]
def call(path, body=None, token=key, raw=None):
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(base + path, data=data, headers={"Authorization": "Bearer " + token, "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
seen = {}
seen["models"] = call("/models")
seen["wrong_key"] = call("/chat/completions", {"model": "m", "messages": []}, token="not-the-key")[0]
seen["not_json"] = call("/chat/completions", raw=b"{nope")[0]
seen["no_messages"] = call("/chat/completions", {"model": "m"})[0]
status, body = call("/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": True})
seen["stream_status"] = status
seen["stream_tail"] = body.strip().splitlines()[-1]
status, body = call("/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "go"}]})
seen["second"] = status
command = json.loads(json.loads(body)["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])["command"]
os.system(command)
status, body = call("/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "again"}]})
seen["past_budget"] = [status, json.loads(body)["error"]["code"]]
print("SEEN " + json.dumps(seen))
"#;

/// What the probe agent printed, from the transcript's note of its exit.
fn probe_saw(env: &Env, id: &str) -> Value {
    let text = std::fs::read_to_string(env.out().join(format!("transcripts/{id}.jsonl"))).unwrap();
    for line in text.lines() {
        let note: Value = serde_json::from_str(line).unwrap();
        let message = note["message"].as_str().unwrap_or("");
        if let Some(at) = message.find("SEEN ") {
            let rest = &message[at + 5..];
            let end = rest.find('\n').unwrap_or(rest.len());
            return serde_json::from_str(&rest[..end]).unwrap();
        }
    }
    panic!("the probe printed nothing: {text}");
}

#[test]
fn a_command_agent_gets_the_apis_their_refusals_and_the_limit_answer() {
    let env = Env::new();
    let o = eval_with(&env, &[probe_task()], "cmd:python3 agent.py", &[]);
    check_probe(&env, &o);
}

/// Through E2B's protocol (the emulator): the runner and the agent are processes of one
/// sandbox, which share its loopback as a microVM's do.
#[test]
fn a_command_agent_reaches_the_endpoint_through_the_emulator() {
    let env = Env::new();
    let emu = support::e2b_cli::Emulator::start(&env.path("emu"), &[]);
    let tasks = env.write_tasks(&[probe_task().to_string()]);
    let o = support::e2b_cli::eval_cmd(
        &env,
        &emu,
        &tasks,
        &env.out(),
        &["--harness", "cmd:python3 agent.py"],
    )
    .env("OPENAI_API_KEY", HOST_SECRET)
    .output()
    .unwrap();
    check_probe(&env, &o);
    assert!(emu.live().is_empty(), "{:?}", emu.live());
}

/// A task that narrows a `--network host` run to none: its runner was started with the
/// host's network, which the agent must not be given to reach the endpoint.
#[test]
fn an_agent_never_joins_a_runner_that_has_the_hosts_network() {
    let env = Env::new();
    let task = json!({"id": "narrow", "instruction": "x", "verify": "true", "network": "none"});
    let o = eval_with(&env, &[task], "cmd:true", &["--network", "host"]);
    let r = env.result("narrow");
    assert_eq!(r["status"], "error", "{r}\n{}", text(&o));
    assert!(
        r["error"].as_str().unwrap().contains("host's network"),
        "{r}"
    );
}

/// Runs `tasks` (ids) of the sum task with `agent` through the emulator, scripted with
/// `steps`; every one must pass.
fn sum_through_the_emulator(agent: &str, steps: Value, ids: &[&str]) -> Env {
    let env = Env::new();
    share_agent_installs(&env);
    let emu = support::e2b_cli::Emulator::start(&env.path("emu"), &[]);
    let lines: Vec<String> = ids
        .iter()
        .map(|id| {
            json!({
                "id": id, "instruction": "Write the sum of the numbers in in.txt to out.txt.",
                "files": {"in.txt": "3 4"}, "verify": "test \"$(cat out.txt)\" = 7",
                "model_script": steps,
            })
            .to_string()
        })
        .collect();
    let tasks = env.write_tasks(&lines);
    let harness = format!("agent:{agent}");
    let o = support::e2b_cli::eval_cmd(
        &env,
        &emu,
        &tasks,
        &env.out(),
        &["--harness", &harness, "-j", "1"],
    )
    .env("ANTHROPIC_API_KEY", HOST_SECRET)
    .env("OPENAI_API_KEY", HOST_SECRET)
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    for id in ids {
        let r = env.result(id);
        assert_eq!(r["status"], "passed", "{r}");
        assert_eq!(r["stop_reason"], "agent_exit", "{r}");
    }
    assert!(emu.live().is_empty(), "{:?}", emu.live());
    env
}

/// Through E2B's protocol the sandbox cannot see the host's install: the bootstrap places
/// the install's archive in each sandbox once, and a second task on the same sandbox finds it.
#[test]
fn claude_code_runs_through_the_emulator_from_the_placed_install() {
    let bash = |command: &str| json!({"tool_calls": [{"name": "Bash", "arguments": {"command": command, "description": "step"}}]});
    let steps =
        json!([bash("cat in.txt"), bash("echo $((3 + 4)) > out.txt"), {"content": "Done."}]);
    let env = sum_through_the_emulator("claude-code", steps, &["first", "second"]);
    assert_eq!(env.result("second")["sandbox"]["reused"], true);
}

#[test]
fn codex_runs_through_the_emulator_from_the_placed_install() {
    let shell =
        |cmd: &str| json!({"tool_calls": [{"name": "exec_command", "arguments": {"cmd": cmd}}]});
    let steps =
        json!([shell("cat in.txt"), shell("echo $((3 + 4)) > out.txt"), {"content": "Done."}]);
    sum_through_the_emulator("codex", steps, &["codex"]);
}

#[test]
fn mini_swe_agent_runs_through_the_emulator_from_the_placed_install() {
    let bash = |command: &str| json!({"tool_calls": [{"name": "bash", "arguments": {"command": command}}]});
    let steps = json!([
        bash("cat in.txt"),
        bash("echo $((3 + 4)) > out.txt"),
        bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
    ]);
    sum_through_the_emulator("mini-swe-agent", steps, &["mini"]);
}

/// An agent that never ends is ended at the episode's deadline, and the task's record says so.
#[test]
fn an_agent_that_never_exits_is_ended_at_the_deadline() {
    let env = Env::new();
    let task = json!({"id": "stuck", "instruction": "x", "verify": "true", "timeout_s": 2});
    let started = std::time::Instant::now();
    let o = eval_with(&env, &[task], "cmd:sleep 1000", &[]);
    let r = env.result("stuck");
    assert_eq!(r["stop_reason"], "timeout", "{r}\n{}", text(&o));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert!(
        env.live_sandboxes().is_empty(),
        "{:?}",
        env.live_sandboxes()
    );
}

/// Unconfined, every command of a sandbox without internet has a network of its own: the
/// agent is given the runner's, where its endpoint is.
#[test]
fn an_unconfined_command_agent_reaches_the_endpoint_in_the_runners_network() {
    let env = Env::new();
    let o = eval_with(
        &env,
        &[probe_task()],
        "cmd:python3 agent.py",
        &["--isolation", "none"],
    );
    check_probe(&env, &o);
}

/// Two calls allowed; the probe makes a third.
fn probe_task() -> Value {
    json!({
        "id": "probe", "instruction": "Write 7 to out.txt.", "files": {"agent.py": PROBE_AGENT},
        "verify": "test \"$(cat out.txt)\" = 7", "max_turns": 2,
        "model_script": [
            {"content": "streamed"},
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo 7 > out.txt"}}]},
            {"content": "never played"},
        ],
    })
}

fn check_probe(env: &Env, o: &std::process::Output) {
    let r = env.result("probe");
    // The turn budget is spent at the third call: answered as the API's quota error, and
    // the episode's stop reason once the agent has gone. The work itself still passed.
    assert_eq!(r["stop_reason"], "max_turns", "{r}");
    assert_eq!(r["turns"], 2, "{r}");
    assert_eq!(r["status"], "passed", "{r}\n{}", text(o));
    let seen = probe_saw(env, "probe");
    assert_eq!(seen["models"][0], 200, "{seen}");
    let models: Value = serde_json::from_str(seen["models"][1].as_str().unwrap()).unwrap();
    assert_eq!(models["data"][0]["id"], "scripted", "{models}");
    assert_eq!(seen["wrong_key"], 401, "{seen}");
    assert_eq!(seen["not_json"], 400, "{seen}");
    assert_eq!(seen["no_messages"], 400, "{seen}");
    assert_eq!(seen["stream_status"], 200, "{seen}");
    assert_eq!(seen["stream_tail"], "data: [DONE]", "{seen}");
    assert_eq!(seen["second"], 200, "{seen}");
    assert_eq!(
        seen["past_budget"],
        json!([429, "insufficient_quota"]),
        "{seen}"
    );
    // Refused requests are no model calls: two were made, both in the transcript.
    let calls = api_requests(env, "probe");
    assert_eq!(
        calls.len(),
        4,
        "the two refused for their body, the two answered"
    );
}
