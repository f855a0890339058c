//! A hostile task, harness or model against the run: what it says reaches the terminal
//! escaped, its transcript stays within its bound, and a task whose handling panics ends as
//! `error` while the run, its records and its summary go on.

mod support;

use support::{task, text, Env};

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
