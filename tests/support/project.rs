//! A scratch environment with a project named `demo` in it, for the `project` tests.

use std::process::{Output, Stdio};

use serde_json::Value;

use super::text;

/// The shared scratch environment with a project named `demo` in it.
pub struct Env(pub super::Env);

impl std::ops::Deref for Env {
    type Target = super::Env;
    fn deref(&self) -> &super::Env {
        &self.0
    }
}

impl Env {
    pub fn new() -> Env {
        let env = Env(super::Env::new());
        let o = env.run(&["project", "create", "demo"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        env
    }

    pub fn put(&self, path: &str, content: &str) -> Output {
        let mut child = self
            .cmd(&["project", "put", "demo", path])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(content.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    pub fn exec(&self, command: &str) -> Output {
        self.run(&["project", "exec", "demo", "--shell", command])
    }

    pub fn sandbox_id(&self) -> String {
        let o = self.run(&["project", "list", "--json"]);
        let v: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
        v[0]["sandbox_id"].as_str().unwrap().to_string()
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Whether `name` lies beside the project, where a `..` let through would put it: beside the
/// workspace in the sandbox, and beside the mirror on the host.
pub fn lies_beside_the_project(env: &Env, name: &str) -> bool {
    let o = env.exec(&format!("test -e ../{name}"));
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    o.status.code() == Some(0) || env.path(&format!("state/projects/demo/{name}")).exists()
}
