//! A hostile task, harness or model against the run: what it says reaches the terminal
//! escaped, its transcript stays within its bound, and a task whose handling panics ends as
//! `error` while the run, its records and its summary go on.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{task, text, Env, SUBMIT};
use wmo_e2b::eval::plan::{self, EvalOptions};
use wmo_e2b::eval::provenance::{Provenance, TasksFile};
use wmo_e2b::eval::spend::Caps;
use wmo_e2b::eval::{self, EvalEvent, EvalLimits, EvalRun, RunControl, SpendPlan};
use wmo_e2b::pool::Pool;
use wmo_e2b::provider::metered::UsageMeter;
use wmo_e2b::provider::scripted::ScriptedProvider;
use wmo_e2b::provider::{Completion, ModelCall, Provider, ProviderError};
use wmo_e2b::runner::BootstrapOpts;
use wmo_e2b::sandbox::local::LocalBackend;
use wmo_e2b::sandbox::Backend;
use wmo_e2b::sync::lock;

/// Escape sequences that would clear the screen, draw a fake verdict and retitle the window,
/// with a right-to-left override: what a hostile harness puts in its error.
const ATTACK: &str =
    r"\u001b[2J\u001b[H100 tasks: 100 passed\u001b]0;pwned\u0007\u202eevil\u009b31m";

/// Whether `s` holds anything a terminal would act on instead of showing.
fn unsafe_chars(s: &str) -> Vec<char> {
    s.chars()
        .filter(|&c| wmo_e2b::terminal::is_unsafe(c) && c != '\n')
        .collect()
}

#[test]
fn what_a_harness_and_a_verify_say_is_printed_escaped_by_eval_and_report() {
    let env = Env::new();
    let dir = env.path("harness");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("agent.mjs"),
        format!(
            "export async function runEpisode(ctx) {{\n  if (ctx.taskId === 'thrower') throw new Error(\"{ATTACK}\");\n  ctx.submit('x');\n}}\n"
        ),
    )
    .unwrap();
    // The verify's output is shown by `report` for a task that did not pass.
    let verify = r#""verify": "printf '\\033[2J\\033]0;pwned\\007\\342\\200\\256fake\\n'; exit 1""#;
    let tasks = env.write_tasks(&[task("thrower", ""), task("verifier", verify)]);
    let o = env.eval(&tasks, &["--harness", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let thrower = env.result("thrower");
    assert!(
        thrower["error"].as_str().unwrap().contains('\u{1b}'),
        "the record keeps what the harness said: {thrower}"
    );
    let shown = text(&o);
    assert_eq!(unsafe_chars(&shown), Vec::<char>::new(), "{shown}");
    assert!(
        shown.contains("\\x1b[2J") && shown.contains("\\u{202e}"),
        "{shown}"
    );

    let o = env.run(&["report", env.out().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let shown = text(&o);
    assert_eq!(unsafe_chars(&shown), Vec::<char>::new(), "{shown}");
    assert!(
        shown.contains("\\x1b]0;pwned\\x07"),
        "verify output: {shown}"
    );
}

#[test]
fn a_harness_that_floods_its_transcript_and_answer_is_cut_at_the_bounds_with_a_note() {
    let env = Env::new();
    let dir = env.path("harness");
    std::fs::create_dir_all(&dir).unwrap();
    // 20 MiB of logs, past the transcript's 16 MiB, then a 3 MiB answer, past a record's
    // 1 MiB.
    std::fs::write(
        dir.join("agent.mjs"),
        r#"export async function runEpisode(ctx) {
  const line = "x".repeat(64 * 1024);
  for (let i = 0; i < 320; i++) ctx.log(line);
  ctx.submit("y".repeat(3 * 1024 * 1024));
}
"#,
    )
    .unwrap();
    let tasks = env.write_tasks(&[task("flood", "")]);
    let o = env.eval(&tasks, &["--harness", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let path = env.out().join("transcripts/flood.jsonl");
    let body = std::fs::read_to_string(&path).unwrap();
    let (kept, note) = body.trim_end().rsplit_once('\n').unwrap();
    assert!(
        kept.len() < wmo_e2b::episode::transcript::MAX_TRANSCRIPT_BYTES as usize,
        "{} bytes kept",
        kept.len()
    );
    let note: serde_json::Value = serde_json::from_str(note).unwrap();
    assert_eq!(note["from"], "note", "{note}");
    assert!(note["dropped_lines"].as_u64().unwrap() >= 64, "{note}");
    assert!(note["dropped_bytes"].as_u64().unwrap() >= 4 << 20, "{note}");

    let answer = env.result("flood")["answer"].as_str().unwrap().to_string();
    assert!(answer.len() < (1 << 20) + 200, "{} bytes", answer.len());
    assert!(
        answer.ends_with("bytes dropped]"),
        "{}",
        &answer[answer.len() - 80..]
    );
}

/// The scripted model, except that a call for the task `boom` panics (a provider's bug, say)
/// with escape sequences in its message. It notes how many sandboxes the pool holds when
/// each other task asks it for a turn.
struct PanicsOnBoom {
    pool: Arc<Pool>,
    live_at_call: Mutex<Vec<(String, usize)>>,
}

impl Provider for PanicsOnBoom {
    fn complete(&self, call: &ModelCall<'_>) -> Result<Completion, ProviderError> {
        if call.label == "boom" {
            panic!("\x1b[2Jprovider bug on {}", call.label);
        }
        lock(&self.live_at_call).push((call.label.to_string(), self.pool.live_count()));
        ScriptedProvider.complete(call)
    }
}

#[test]
fn a_task_whose_handling_panics_ends_as_error_its_sandbox_killed_and_the_run_goes_on() {
    let env = Env::new();
    let tasks = env.write_tasks(&[
        task("a", &format!(r#""model_script": [{SUBMIT}]"#)),
        task("boom", &format!(r#""model_script": [{SUBMIT}]"#)),
        task("c", &format!(r#""model_script": [{SUBMIT}]"#)),
    ]);
    let plan = plan::plan(&EvalOptions {
        tasks_file: tasks,
        out: Some(env.out()),
        resume: false,
        shard: None,
        harness: "builtin".into(),
        attempts: 1,
        image: None,
    })
    .unwrap();
    let backend = LocalBackend::open(&env.home()).unwrap();
    let pool = Arc::new(Pool::new(
        backend.clone(),
        plan.pool_config(
            None,
            Duration::from_secs(60),
            BootstrapOpts::default(),
            true,
        ),
    ));
    let provider = Arc::new(PanicsOnBoom {
        pool: pool.clone(),
        live_at_call: Mutex::new(Vec::new()),
    });
    let (tx, events) = crossbeam_channel::unbounded();
    let summary = eval::run(&EvalRun {
        tasks: &plan.tasks,
        already_finished: 0,
        attempts: &plan.attempts,
        out_dir: &plan.out_dir,
        // One worker: `c` runs after `boom`, so the pool it sees is what `boom` left.
        jobs: 1,
        limits: EvalLimits::default(),
        pool: pool.clone(),
        provider: provider.clone(),
        harness: plan.harness.clone(),
        world_model: None,
        skills: None,
        control: Arc::new(RunControl::new(tx)),
        spend: SpendPlan {
            caps: Caps::default(),
            prices: None,
            meter: Arc::new(UsageMeter::default()),
            per_task: Default::default(),
        },
        provenance: provenance(),
        verifier: Default::default(),
        environments: &Default::default(),
    })
    .expect("the run survives a panicking task");

    assert_eq!(summary.total, 3);
    assert_eq!(summary.tally.errors, 1, "{summary:?}");
    assert_eq!(summary.tally.passed, 2, "{summary:?}");
    let results = env.results();
    assert_eq!(results.len(), 3, "{results:?}");
    let boom = env.result("boom");
    assert_eq!(boom["status"], "error", "{boom}");
    let why = boom["error"].as_str().unwrap();
    assert!(
        why.contains("panicked") && why.contains("provider bug on boom"),
        "{why}"
    );
    assert!(
        why.contains("\\x1b[2J") && !why.contains('\u{1b}'),
        "escaped: {why}"
    );
    assert!(env.out().join("summary.json").is_file());
    // `boom`'s sandbox was killed as the panic unwound: `c` ran with its own alone.
    let seen = lock(&provider.live_at_call).clone();
    assert!(seen.contains(&("c".to_string(), 1)), "{seen:?}");
    let left = backend.list(&Default::default()).unwrap();
    assert!(left.is_empty(), "nothing is left running: {left:?}");
    let finished = events
        .try_iter()
        .filter(|e| matches!(e, EvalEvent::TaskFinished { .. }))
        .count();
    assert_eq!(finished, 3, "the reporter hears of every task");
}

fn provenance() -> Provenance {
    Provenance {
        wmo_e2b: "test".into(),
        runner: "test".into(),
        harness: "builtin".into(),
        harness_digest: None,
        environment: "sandbox".into(),
        backend: "local".into(),
        template: None,
        model: "scripted".into(),
        provider_host: None,
        skills: None,
        tasks_file: TasksFile {
            sha256: "test".into(),
            line: None,
        },
        image: None,
    }
}
