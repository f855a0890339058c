//! Two tasks for one sandbox: the first leaves everything behind it can (processes detached
//! every way a shell allows, files in the workspace, the home, its dotfiles and /tmp); the
//! second, served by the same sandbox after a reset, passes only if none of it is there.

use serde_json::{json, Value};

/// A loop that announces it is alive (in /tmp) and keeps overwriting the next task's answer.
fn poison(kind: &str) -> String {
    format!(
        "while :; do echo {kind} > /tmp/alive-{kind}; echo poisoned > $HOME/workspace/out.txt; \
         sleep 0.05; done"
    )
}

/// Marks the home and `/tmp` themselves (not their contents) with an extended attribute.
const LEAK_XATTRS: &str =
    "import os\nfor p in (\"/home/user\", \"/tmp\"): os.setxattr(p, \"user.leak\", b\"1\")";

/// The two tasks as tasks-file lines: `dirty` first, then `clean`.
pub fn tasks() -> Vec<String> {
    let detach = format!(
        "({loop1}) > /dev/null 2>&1 & \
         ( ({loop2}) > /dev/null 2>&1 & ); \
         setsid bash -c '{loop3}' > /dev/null 2>&1 & \
         nohup bash -c '{loop4}' > /dev/null 2>&1 & \
         echo leak > /tmp/leak; echo 'export POISON=1' >> ~/.bashrc; \
         mkdir -p ~/.config && echo leak > ~/.config/leak; echo leak > ~/leak.txt; \
         echo leak > /dev/shm/leak; ipcmk -M 4096 > /dev/null 2>&1; \
         {{ [ -w /var/tmp ] && echo leak > /var/tmp/leak; }}; \
         mkdir -p ~/locked/inner /tmp/locked && chmod 000 ~/locked /tmp/locked; \
         python3 -c '{xattrs}'; echo started",
        loop1 = poison("background"),
        loop2 = poison("double-fork"),
        loop3 = poison("setsid"),
        loop4 = poison("nohup"),
        xattrs = LEAK_XATTRS,
    );
    let submit = json!({"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]});
    let dirty = json!({
        "id": "dirty",
        "instruction": "leave as much behind as you can",
        "files": {"answer_key.txt": "42"},
        // A setup that ends in `&` must background only itself.
        "setup": format!("{} > /dev/null 2>&1 &", poison("setup")),
        "model_script": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": detach}}]},
            submit,
        ],
    });
    // Long enough for any surviving loop to have struck again.
    let work = "echo good > out.txt; sleep 1; echo done";
    let checks = [
        "test -d .",
        "test \"$(cat out.txt)\" = good",
        "test ! -e answer_key.txt",
        "test -z \"$(ls -A /tmp)\"",
        "test ! -e ~/leak.txt",
        "test ! -e ~/.config/leak",
        "! grep -q POISON ~/.bashrc 2>/dev/null",
        "test ! -e /dev/shm/leak",
        "test ! -e /var/tmp/leak",
        "test ! -e ~/locked",
        "! ipcs -m | grep -q ^0x",
        "python3 -c 'import os, sys; sys.exit(any(\"user.leak\" in os.listxattr(p) for p in (\"/home/user\", \"/tmp\")))'",
        // The bracket keeps pgrep from finding this very command line.
        "! pgrep -f 'alive[-]' > /dev/null",
    ];
    let clean = json!({
        "id": "clean",
        "instruction": "write good to out.txt",
        "model_script": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": work}}]},
            submit,
        ],
        "verify": checks
            .iter()
            .map(|c| format!("{{ {c}; }} || {{ echo 'failed: {}'; exit 1; }}", c.replace('\'', "")))
            .collect::<Vec<_>>()
            .join("; "),
    });
    vec![dirty.to_string(), clean.to_string()]
}

/// Checks the two results: both passed, and `clean` ran on the sandbox `dirty` left,
/// reused.
pub fn check(results: &[Value]) {
    let find = |id: &str| super::result_in(results, id);
    let (dirty, clean) = (find("dirty"), find("clean"));
    assert_eq!(dirty["status"], "passed", "{dirty}");
    assert_eq!(clean["status"], "passed", "{clean}");
    assert_eq!(clean["sandbox"]["reused"], true, "{clean}");
    assert_eq!(clean["sandbox"]["id"], dirty["sandbox"]["id"], "{clean}");
}
