//! A template build as a Dockerfile: the base image, then E2B's steps (`RUN`, `COPY`, `ENV`,
//! `WORKDIR`, `USER`) in order, each written so nothing a client sends can add a line of its
//! own. Uploaded files sit in the build context under `files/<hash>/`, as the SDK tarred them.

use serde_json::{Map, Value};

use crate::glob::is_pattern;

/// Where each `COPY` step's files are laid out in the build context, by step index.
pub(super) const STEPS_DIR: &str = "steps";
/// Steps in one build: the SDK's templates have tens.
const MAX_STEPS: usize = 1024;

/// One step as the API takes it (`TemplateStep`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Step {
    pub kind: String,
    pub args: Vec<String>,
    pub files_hash: Option<String>,
}

/// What a build makes: its base image and every step, those of the templates it starts from
/// first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Recipe {
    pub from_image: String,
    pub steps: Vec<Step>,
}

/// Why a build's request or steps cannot become a Dockerfile; the message is the build's
/// reason, which the SDK raises.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(super) enum RecipeError {
    #[error("steps[{index}]: {why}")]
    Step { index: usize, why: String },
    #[error("{0}")]
    Request(String),
}

/// The steps of a `TemplateBuildStartV2` body.
pub(super) fn read_steps(body: &Map<String, Value>) -> Result<Vec<Step>, RecipeError> {
    let bad = |why: &str| RecipeError::Request(why.to_string());
    let items = match body.get("steps") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(bad("steps must be a list")),
    };
    if items.len() > MAX_STEPS {
        return Err(bad(&format!("a build has at most {MAX_STEPS} steps")));
    }
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let step_error = |why: &str| RecipeError::Step {
                index,
                why: why.to_string(),
            };
            let obj = item
                .as_object()
                .ok_or_else(|| step_error("must be an object"))?;
            let kind = obj
                .get("type")
                .and_then(Value::as_str)
                .ok_or_else(|| step_error("type must be a string"))?;
            let args = match obj.get("args") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| step_error("args must be a list of strings"))?,
                Some(_) => return Err(step_error("args must be a list of strings")),
            };
            let files_hash = match obj.get("filesHash") {
                None | Some(Value::Null) => None,
                Some(Value::String(h)) if is_files_hash(h) => Some(h.clone()),
                Some(_) => return Err(step_error("filesHash must be a sha256 in hex")),
            };
            Ok(Step {
                kind: kind.to_string(),
                args,
                files_hash,
            })
        })
        .collect()
}

/// A `filesHash` as the SDK makes it (sha256, lowercase hex): also a file name of ours, so
/// nothing else is one.
pub(super) fn is_files_hash(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The Dockerfile of `recipe`.
pub(super) fn dockerfile(recipe: &Recipe) -> Result<String, RecipeError> {
    let mut out = String::new();
    let from = one_line(&recipe.from_image)
        .filter(|f| !f.is_empty() && !f.contains(char::is_whitespace))
        .ok_or_else(|| RecipeError::Request("fromImage must be one image reference".into()))?;
    out.push_str(&format!("FROM {from}\n"));
    // E2B runs a template's steps as root from `/` until a step says otherwise.
    out.push_str("USER root\nWORKDIR /\n");
    let mut user = "root".to_string();
    for (index, step) in recipe.steps.iter().enumerate() {
        let fail = |why: String| RecipeError::Step { index, why };
        let arg = |i: usize| step.args.get(i).map(String::as_str).unwrap_or("");
        match step.kind.as_str() {
            "RUN" => {
                let command = arg(0);
                if command.is_empty() {
                    return Err(fail("RUN needs a command".into()));
                }
                let as_user = Some(arg(1)).filter(|u| !u.is_empty());
                if let Some(u) = as_user {
                    out.push_str(&format!("USER {}\n", name(u).map_err(fail)?));
                }
                out.push_str(&format!("RUN {}\n", exec_form(&["/bin/sh", "-c", command])));
                if as_user.is_some() {
                    out.push_str(&format!("USER {user}\n"));
                }
            }
            "COPY" => {
                if step.files_hash.is_none() {
                    return Err(fail("COPY needs the filesHash of its upload".into()));
                }
                let (src, dest) = (arg(0), arg(1));
                if dest.is_empty() || one_line(dest).is_none() {
                    return Err(fail("COPY needs a source and a destination".into()));
                }
                relative(src).map_err(fail)?;
                let mut flags = String::new();
                if !arg(2).is_empty() {
                    flags.push_str(&format!("--chown={} ", name(arg(2)).map_err(fail)?));
                }
                if !arg(3).is_empty() {
                    let mode = arg(3);
                    if mode.len() > 4 || !mode.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
                        return Err(fail(format!("COPY mode {mode:?} is not octal")));
                    }
                    flags.push_str(&format!("--chmod={mode} "));
                }
                // What the step copies is laid out by `build` in a directory of its own,
                // copied whole: entries inside a directory source keep their symlinks, where
                // a source named at the top would be followed.
                let (into, _) = copy_target(src, dest);
                let source = format!("{STEPS_DIR}/{index}/");
                let into = format!("{}/", into.trim_end_matches('/'));
                out.push_str(&format!("COPY {flags}{}\n", exec_form(&[&source, &into])));
            }
            "ENV" => {
                if step.args.is_empty() || step.args.len() % 2 != 0 {
                    return Err(fail("ENV takes names and values in pairs".into()));
                }
                for pair in step.args.chunks(2) {
                    let key = &pair[0];
                    let key_ok = !key.is_empty()
                        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                    if !key_ok {
                        return Err(fail(format!("ENV name {key:?} is not a variable name")));
                    }
                    let value = one_line(&pair[1])
                        .ok_or_else(|| fail(format!("ENV {key}: a value is one line")))?;
                    out.push_str(&format!("ENV {key}={}\n", quoted(value)));
                }
            }
            "WORKDIR" => {
                let dir = one_line(arg(0))
                    .filter(|d| !d.is_empty())
                    .ok_or_else(|| fail("WORKDIR needs one line naming a directory".into()))?;
                out.push_str(&format!("WORKDIR {}\n", quoted(dir)));
            }
            "USER" => {
                user = name(arg(0)).map_err(fail)?.to_string();
                out.push_str(&format!("USER {user}\n"));
            }
            other => {
                return Err(fail(format!(
                    "step type {other:?} is not one the emulator builds (RUN, COPY, ENV, \
                     WORKDIR, USER)"
                )))
            }
        }
    }
    Ok(out)
}

/// Where a `COPY` of `src` to `dest` puts what it copies, as E2B does: the directory it goes
/// into, and the name it takes there (`None`: every match of a pattern keeps its own name, in
/// `dest` as a directory). A source without a pattern becomes `dest` itself, unless `dest`
/// ends with a slash.
pub(super) fn copy_target<'a>(src: &'a str, dest: &'a str) -> (&'a str, Option<&'a str>) {
    let base = |p: &'a str| p.trim_end_matches('/').rsplit('/').next().unwrap_or(p);
    if is_pattern(src) {
        return (dest, None);
    }
    if is_dir_path(dest) {
        return (dest, Some(base(src)));
    }
    match dest.trim_end_matches('/').rsplit_once('/') {
        Some(("", name)) => ("/", Some(name)),
        Some((dir, name)) => (dir, Some(name)),
        None => (".", Some(dest)),
    }
}

/// A destination that names a directory: it ends with `/`, or is `.` (or ends `/.`).
pub(super) fn is_dir_path(dest: &str) -> bool {
    dest.ends_with('/') || dest == "." || dest.ends_with("/.")
}

fn one_line(s: &str) -> Option<&str> {
    (!s.contains(['\n', '\r', '\0'])).then_some(s)
}

/// A user, or `user:group`, as `useradd` would take it.
fn name(s: &str) -> Result<&str, String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
    ok.then_some(s)
        .ok_or_else(|| format!("{s:?} is not a user name"))
}

/// A path inside the uploaded files: relative, never climbing.
pub(super) fn relative(src: &str) -> Result<&str, String> {
    let climbs = src.split('/').any(|p| p == "..");
    if src.is_empty() || src.starts_with('/') || climbs || one_line(src).is_none() {
        return Err(format!(
            "COPY source {src:?} is not a path inside the uploaded files"
        ));
    }
    Ok(src)
}

/// A JSON array: the Dockerfile's exec form, which no argument can break out of.
fn exec_form(args: &[&str]) -> String {
    Value::from(args.iter().map(|a| Value::from(*a)).collect::<Vec<_>>()).to_string()
}

/// A double-quoted Dockerfile word: `\`, `"` and `$` escaped, so nothing is expanded.
fn quoted(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        if matches!(c, '\\' | '"' | '$') {
            q.push('\\');
        }
        q.push(c);
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const HASH: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn step(kind: &str, args: &[&str]) -> Step {
        Step {
            kind: kind.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            files_hash: (kind == "COPY").then(|| HASH.to_string()),
        }
    }

    fn recipe(steps: Vec<Step>) -> Recipe {
        Recipe {
            from_image: "ubuntu:22.04".into(),
            steps,
        }
    }

    #[test]
    fn steps_become_dockerfile_lines_in_order() {
        let file = dockerfile(&recipe(vec![
            step("COPY", &["folder/*", "folder", "", ""]),
            step("RUN", &["cat folder/test.txt", ""]),
            step("RUN", &["whoami", "user"]),
            step("ENV", &["A", "1", "B", "two $HOME \"x\""]),
            step("WORKDIR", &["/app"]),
            step("USER", &["user"]),
        ]))
        .unwrap();
        let want = "FROM ubuntu:22.04\nUSER root\nWORKDIR /\n\
             COPY [\"steps/0/\",\"folder/\"]\n\
             RUN [\"/bin/sh\",\"-c\",\"cat folder/test.txt\"]\n\
             USER user\nRUN [\"/bin/sh\",\"-c\",\"whoami\"]\nUSER root\n\
             ENV A=\"1\"\nENV B=\"two \\$HOME \\\"x\\\"\"\n\
             WORKDIR \"/app\"\nUSER user\n";
        assert_eq!(file, want);
    }

    #[test]
    fn a_copy_lands_where_e2b_puts_it() {
        assert_eq!(copy_target("folder/*", "folder"), ("folder", None));
        assert_eq!(copy_target("a.txt", "/app/b.txt"), ("/app", Some("b.txt")));
        assert_eq!(copy_target("dir/a.txt", "/app/"), ("/app/", Some("a.txt")));
        assert_eq!(copy_target("a.txt", "b.txt"), (".", Some("b.txt")));
        assert_eq!(copy_target("a.txt", "/b"), ("/", Some("b")));
        assert_eq!(copy_target("dir", "/opt/dir"), ("/opt", Some("dir")));
        assert_eq!(copy_target("a.txt", "."), (".", Some("a.txt")));
        let file = dockerfile(&recipe(vec![step(
            "COPY",
            &["a.txt", "/app/b.txt", "1000", "0755"],
        )]))
        .unwrap();
        assert!(
            file.contains("COPY --chown=1000 --chmod=0755 [\"steps/0/\",\"/app/\"]\n"),
            "{file}"
        );
    }

    #[test]
    fn a_command_with_new_lines_stays_one_run() {
        let file = dockerfile(&recipe(vec![step("RUN", &["echo a\nRUN evil", ""])])).unwrap();
        assert_eq!(file.lines().filter(|l| l.starts_with("RUN")).count(), 1);
        assert!(file.contains(r#"RUN ["/bin/sh","-c","echo a\nRUN evil"]"#));
    }

    #[test]
    fn hostile_steps_are_refused_by_index() {
        for (bad, index) in [
            (step("COPY", &["../../etc/passwd", "/x", "", ""]), 0),
            (step("COPY", &["/etc/passwd", "/x", "", ""]), 0),
            (step("COPY", &["a", "/x", "", "9777"]), 0),
            (step("COPY", &["a", "/x", "root\nRUN x", ""]), 0),
            (step("ENV", &["A B", "1"]), 0),
            (step("ENV", &["A", "1\nRUN evil"]), 0),
            (step("ENV", &["A"]), 0),
            (step("WORKDIR", &["/a\nRUN evil"]), 0),
            (step("USER", &["root\nRUN evil"]), 0),
            (step("RUN", &["x", "bad user"]), 0),
            (step("ADD", &["http://x", "/x"]), 0),
        ] {
            let err = dockerfile(&recipe(vec![bad.clone()])).unwrap_err();
            assert!(
                matches!(err, RecipeError::Step { index: i, .. } if i == index),
                "{bad:?}: {err}"
            );
        }
        let no_hash = Step {
            files_hash: None,
            ..step("COPY", &["a", "b", "", ""])
        };
        assert!(dockerfile(&recipe(vec![no_hash])).is_err());
        let bad_from = Recipe {
            from_image: "x\nRUN evil".into(),
            steps: Vec::new(),
        };
        assert!(matches!(
            dockerfile(&bad_from),
            Err(RecipeError::Request(_))
        ));
    }

    #[test]
    fn steps_read_as_the_sdk_sends_them() {
        let body = json!({"steps": [
            {"type": "COPY", "args": ["a", "b", "", ""], "filesHash": HASH, "force": false},
            {"type": "RUN", "args": ["ls"], "force": true},
        ]});
        let steps = read_steps(body.as_object().unwrap()).unwrap();
        assert_eq!(steps[0].files_hash.as_deref(), Some(HASH));
        assert_eq!(steps[1].args, vec!["ls".to_string()]);
        for bad in [
            json!({"steps": "RUN"}),
            json!({"steps": [{"args": []}]}),
            json!({"steps": [{"type": "COPY", "filesHash": "../x"}]}),
            json!({"steps": [{"type": "RUN", "args": [1]}]}),
        ] {
            assert!(read_steps(bad.as_object().unwrap()).is_err(), "{bad}");
        }
        assert!(is_files_hash(HASH));
        assert!(!is_files_hash(&HASH.to_uppercase()));
        assert!(!is_files_hash("../../etc"));
    }
}
