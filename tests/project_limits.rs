//! A project sandbox is bounded as an eval's is: an agent (or a command) in it cannot take
//! the host's memory.

use std::process::Output;

mod support;

use support::{text, Env};

fn exec(env: &Env, command: &str) -> Output {
    env.run(&[
        "project",
        "exec",
        "demo",
        "--timeout",
        "120s",
        "--shell",
        command,
    ])
}

#[test]
fn a_memory_hog_in_a_project_is_killed_at_the_sandbox_limit() {
    let env = Env::new();
    let o = env.run(&["project", "create", "demo"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // 6 GiB, past the default 4096 MiB limit (and within what this host could give).
    let o = exec(
        &env,
        "perl -e '$x = \"a\" x (6 * 1024 * 1024 * 1024); print length $x'",
    );
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("6442450944"),
        "{}",
        text(&o)
    );
    // The project goes on.
    let o = exec(&env, "echo alive");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "alive\n",
        "{}",
        text(&o)
    );
    let o = env.run(&["project", "close", "demo"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}
