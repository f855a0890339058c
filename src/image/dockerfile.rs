//! A single-stage Dockerfile read as the steps of a template (E2B builds those, not
//! Dockerfiles): its base image, then `RUN`, `COPY`/`ADD` of the build context, `ENV`,
//! `WORKDIR` and `USER` in order, build arguments substituted as the builders do. What only
//! describes how a container starts (`CMD`, `ENTRYPOINT`, `EXPOSE`, `LABEL`, ...) changes no
//! file a task sees and is left out; what cannot be said as those steps is refused by name.

use super::builder::{logical_lines, substitute};
use crate::sandbox::shell_quote;

/// One step of the recipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A shell command, as `user` when the Dockerfile set one.
    Run {
        command: String,
        user: Option<String>,
    },
    /// Context paths (patterns allowed) copied to `dest`.
    Copy {
        sources: Vec<String>,
        dest: String,
        chown: Option<String>,
        chmod: Option<String>,
    },
    Env(Vec<(String, String)>),
    Workdir(String),
    User(String),
}

/// A Dockerfile as a base image and steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    pub from: String,
    pub steps: Vec<Step>,
    /// The last `WORKDIR` (absolute), where a task works.
    pub workdir: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DockerfileError {
    #[error("`{instruction}`: {why}")]
    Unsupported { instruction: String, why: String },
    #[error("no FROM")]
    NoFrom,
}

/// Reads `text` with the build arguments `args` (a later one of a name wins).
pub fn read(text: &str, args: &[(String, String)]) -> Result<Recipe, DockerfileError> {
    let mut globals: Vec<(String, String)> = Vec::new();
    let mut from: Option<String> = None;
    // Build arguments declared after FROM (seen by RUN as variables), and ENV's.
    let mut locals: Vec<(String, String)> = Vec::new();
    let mut env: Vec<(String, String)> = Vec::new();
    let mut steps = Vec::new();
    let mut user: Option<String> = None;
    let mut workdir: Option<String> = None;
    for line in logical_lines(text) {
        let line = line.trim();
        let (word, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let rest = rest.trim();
        let refuse = |why: &str| DockerfileError::Unsupported {
            instruction: crate::terminal::escape(&truncate(line)).into_owned(),
            why: why.to_string(),
        };
        let vars = || -> Vec<(String, String)> {
            globals.iter().chain(&locals).chain(&env).cloned().collect()
        };
        match word.to_ascii_uppercase().as_str() {
            "" => {}
            "ARG" => {
                for decl in rest.split_whitespace() {
                    let (name, default) = match decl.split_once('=') {
                        Some((n, d)) => (n, Some(unquote(d))),
                        None => (decl, None),
                    };
                    let given = args.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v);
                    let value = match (given, default, from.is_some()) {
                        (Some(v), _, _) => v.clone(),
                        (None, Some(d), _) => d,
                        // Declared again after FROM without a default: the global's value.
                        (None, None, true) => globals
                            .iter()
                            .find(|(k, _)| k == name)
                            .map(|(_, v)| v.clone())
                            .unwrap_or_default(),
                        (None, None, false) => String::new(),
                    };
                    match from {
                        None => globals.push((name.to_string(), value)),
                        Some(_) => locals.push((name.to_string(), value)),
                    }
                }
            }
            "FROM" => {
                if from.is_some() {
                    return Err(refuse("a multi-stage build (a second FROM)"));
                }
                let image = rest
                    .split_whitespace()
                    .find(|w| !w.starts_with("--"))
                    .ok_or_else(|| refuse("FROM names no image"))?;
                from = Some(substitute(image, &globals));
            }
            _ if from.is_none() => return Err(refuse("comes before FROM")),
            "RUN" => {
                let command = match exec_form(rest) {
                    Some(words) => words
                        .iter()
                        .map(|w| shell_quote(w))
                        .collect::<Vec<_>>()
                        .join(" "),
                    None => rest.to_string(),
                };
                if rest.starts_with("--") {
                    return Err(refuse("RUN options (--mount, --network) are not steps"));
                }
                // The build arguments declared after FROM are the command's variables.
                let exports: Vec<String> = locals
                    .iter()
                    .map(|(k, v)| format!("export {k}={}; ", shell_quote(v)))
                    .collect();
                steps.push(Step::Run {
                    command: format!("{}{command}", exports.concat()),
                    user: user.clone(),
                });
            }
            "COPY" | "ADD" => {
                let is_add = word.eq_ignore_ascii_case("ADD");
                let mut words: Vec<String> = match exec_form(rest) {
                    Some(w) => w,
                    None => rest.split_whitespace().map(str::to_string).collect(),
                };
                let (mut chown, mut chmod) = (None, None);
                while words.first().is_some_and(|w| w.starts_with("--")) {
                    let flag = words.remove(0);
                    match flag.split_once('=') {
                        Some(("--chown", v)) => chown = Some(substitute(v, &vars())),
                        Some(("--chmod", v)) => chmod = Some(v.to_string()),
                        _ if flag == "--link" => {}
                        _ => return Err(refuse(&format!("{flag} copies from no build context"))),
                    }
                }
                if words.len() < 2 {
                    return Err(refuse("needs a source and a destination"));
                }
                let dest = substitute(&words.pop().unwrap_or_default(), &vars());
                let sources: Vec<String> = words.iter().map(|w| substitute(w, &vars())).collect();
                if is_add && sources.iter().any(|s| s.contains("://") || is_archive(s)) {
                    return Err(refuse(
                        "ADD of a URL or an archive (copy plain files instead)",
                    ));
                }
                steps.push(Step::Copy {
                    sources,
                    dest,
                    chown,
                    chmod,
                });
            }
            "ENV" => {
                let pairs =
                    env_pairs(rest, &vars()).ok_or_else(|| refuse("ENV names no variable"))?;
                env.extend(pairs.iter().cloned());
                steps.push(Step::Env(pairs));
            }
            "WORKDIR" => {
                let dir = substitute(&unquote(rest), &vars());
                let dir = match (dir.starts_with('/'), &workdir) {
                    (true, _) => dir,
                    (false, Some(base)) => format!("{}/{dir}", base.trim_end_matches('/')),
                    (false, None) => format!("/{dir}"),
                };
                workdir = Some(dir.clone());
                steps.push(Step::Workdir(dir));
            }
            "USER" => {
                let u = substitute(&unquote(rest), &vars());
                user = Some(u.clone());
                steps.push(Step::User(u));
            }
            "CMD" | "ENTRYPOINT" | "EXPOSE" | "LABEL" | "MAINTAINER" | "VOLUME" | "STOPSIGNAL"
            | "HEALTHCHECK" => {}
            "SHELL" | "ONBUILD" => return Err(refuse("not a step a template takes")),
            _ => return Err(refuse("not a Dockerfile instruction")),
        }
    }
    Ok(Recipe {
        from: from.ok_or(DockerfileError::NoFrom)?,
        steps,
        workdir,
    })
}

/// A JSON array of strings (the exec form), when `rest` is one.
fn exec_form(rest: &str) -> Option<Vec<String>> {
    rest.starts_with('[')
        .then(|| serde_json::from_str::<Vec<String>>(rest).ok())
        .flatten()
}

/// `K=V K2="V 2"`, or the old `K V...` form; values substituted.
fn env_pairs(rest: &str, vars: &[(String, String)]) -> Option<Vec<(String, String)>> {
    let words = split_words(rest);
    let first = words.first()?;
    if !first.contains('=') {
        let value = rest[first.len()..].trim();
        return Some(vec![(first.clone(), substitute(&unquote(value), vars))]);
    }
    words
        .iter()
        .map(|w| {
            let (k, v) = w.split_once('=')?;
            Some((k.to_string(), substitute(&unquote(v), vars)))
        })
        .collect()
}

/// Words split on blanks outside double quotes (the quotes kept, for `unquote`).
fn split_words(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in s.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                current.push(c);
            }
            c if c.is_whitespace() && !quoted => {
                if !current.is_empty() {
                    words.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    s.strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .unwrap_or(s)
        .to_string()
}

fn is_archive(s: &str) -> bool {
    [".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst"]
        .iter()
        .any(|ext| s.ends_with(ext))
}

fn truncate(line: &str) -> String {
    line.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_fixtures_kind_of_dockerfile_becomes_steps() {
        let text = "# base\nARG BASE=busybox:1.36\nFROM ${BASE}\nARG V=2\n\
                    ENV PATH=/usr/local/bin:/bin GREETING=\"hi there\"\n\
                    COPY --chown=1000 a.txt b/ /opt/x/\nRUN echo $V \\\n && true\n\
                    USER app\nRUN [\"sh\", \"-c\", \"id\"]\nWORKDIR /data\nWORKDIR sub\n\
                    CMD [\"sh\"]\n";
        let r = read(text, &args(&[("BASE", "127.0.0.1:5000/base:1")])).unwrap();
        assert_eq!(r.from, "127.0.0.1:5000/base:1");
        assert_eq!(r.workdir.as_deref(), Some("/data/sub"));
        assert_eq!(
            r.steps,
            vec![
                Step::Env(vec![
                    ("PATH".into(), "/usr/local/bin:/bin".into()),
                    ("GREETING".into(), "hi there".into())
                ]),
                Step::Copy {
                    sources: vec!["a.txt".into(), "b/".into()],
                    dest: "/opt/x/".into(),
                    chown: Some("1000".into()),
                    chmod: None
                },
                Step::Run {
                    command: "export V=2; echo $V  && true".into(),
                    user: None
                },
                Step::User("app".into()),
                Step::Run {
                    command: "export V=2; sh -c id".into(),
                    user: Some("app".into())
                },
                Step::Workdir("/data".into()),
                Step::Workdir("/data/sub".into()),
            ]
        );
        let default = read(text, &[]).unwrap();
        assert_eq!(default.from, "busybox:1.36");
    }

    #[test]
    fn what_a_template_cannot_take_is_refused_by_name() {
        for (text, names) in [
            ("FROM a AS b\nFROM c\n", "FROM c"),
            ("FROM a\nCOPY --from=b /x /y\n", "--from"),
            ("FROM a\nADD https://x/y /y\n", "ADD"),
            ("FROM a\nADD src.tar.gz /y\n", "ADD"),
            ("FROM a\nRUN --mount=type=cache,target=/x true\n", "RUN"),
            ("FROM a\nSHELL [\"bash\"]\n", "SHELL"),
            ("RUN true\nFROM a\n", "RUN"),
            ("FROM a\nFROBNICATE\n", "FROBNICATE"),
            ("FROM a\nCOPY onlyone\n", "COPY"),
        ] {
            let err = read(text, &[]).unwrap_err();
            assert!(err.to_string().contains(names), "{text:?}: {err}");
        }
        assert_eq!(
            read("# nothing\n", &[]).unwrap_err(),
            DockerfileError::NoFrom
        );
    }
}
