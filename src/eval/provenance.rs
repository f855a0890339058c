//! What produced a result, on every record and in `summary.json`: a score is comparable with
//! another only if both say which build, runner, harness, environment, backend, model and
//! tasks made them.

use serde::Serialize;
use serde_json::Value;

use super::Harness;
use crate::digest::sha256;

/// The run's provenance; each record adds its task's line in the tasks file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Provenance {
    /// This program's version.
    pub wmo_e2b: String,
    /// sha256 of the runner files sent into sandboxes, as sent.
    pub runner: String,
    /// `builtin`, `pi@<version>` or `user`.
    pub harness: String,
    /// sha256 of what the harness is: pi's bundle (the one file its sandboxes run; its
    /// pinned specs where the host built none), a user harness's files; none for the
    /// builtin loop.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub harness_digest: Option<String>,
    /// `sandbox` or `world-model`.
    pub environment: String,
    /// `local` or `e2b`.
    pub backend: String,
    /// The sandbox template (e2b), when one applies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    pub model: String,
    /// The host of the model API's base URL (never a key); none for the scripted model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_host: Option<String>,
    /// sha256 of the skills offered (`--skills`), when any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skills: Option<String>,
    pub tasks_file: TasksFile,
    /// The image the task ran on, as `reference@digest` (on a record, when it ran on one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// The tasks file: its digest, and (on a record) the task's line in it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TasksFile {
    pub sha256: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
}

/// The harness as provenance names it, and its digest. `pi_bundle` is the digest of pi's
/// bundle (`sha256:<hex>`) where the host built it (elsewhere the pinned specs stand for
/// it).
pub fn harness_of(harness: &Harness, pi_bundle: Option<&str>) -> (String, Option<String>) {
    match harness {
        Harness::Builtin => ("builtin".into(), None),
        Harness::Pi => {
            let digest = match pi_bundle {
                Some(digest) => digest.to_string(),
                None => sha256(crate::runner::pi::specs().join("\n").as_bytes()),
            };
            (
                format!("pi@{}", crate::runner::pi::PI_VERSION),
                Some(digest),
            )
        }
        Harness::Files(files) => ("user".into(), Some(files.digest.clone())),
        Harness::Oracle | Harness::Nop => (harness.name().into(), None),
        Harness::Agent(agent) => match agent.recipe {
            Some(recipe) => (
                format!("agent:{}@{}", recipe.name, recipe.version),
                agent.digest.clone(),
            ),
            None => ("cmd".into(), Some(sha256(agent.command.as_bytes()))),
        },
    }
}

/// The host of a base URL (`https://api.openai.com/v1` -> `api.openai.com`).
pub fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next()?;
    // Credentials in a URL are never recorded.
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    (!host.is_empty()).then(|| host.to_string())
}

impl Provenance {
    /// This provenance for the task on `line`.
    pub fn for_line(&self, line: usize) -> Provenance {
        Provenance {
            tasks_file: TasksFile {
                sha256: self.tasks_file.sha256.clone(),
                line: Some(line),
            },
            ..self.clone()
        }
    }

    /// This provenance for a task that ran on `image` (`reference@digest`).
    pub fn on_image(self, image: Option<String>) -> Provenance {
        Provenance { image, ..self }
    }

    /// The first of the fields that must match for results to be mixed (harness and its
    /// digest, runner, model) that differs from `earlier` (a record's `provenance`): its
    /// name, the earlier value and ours.
    pub fn mismatch(&self, earlier: &Value) -> Option<(&'static str, String, String)> {
        let ours = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".into());
        let fields: [(&'static str, String); 4] = [
            ("harness", self.harness.clone()),
            ("harness_digest", ours(&self.harness_digest)),
            ("runner", self.runner.clone()),
            ("model", self.model.clone()),
        ];
        fields.into_iter().find_map(|(name, now)| {
            let then = earlier
                .get(name)
                .and_then(Value::as_str)
                .unwrap_or("(none)")
                .to_string();
            (then != now).then_some((name, then, now))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_drop_scheme_path_and_credentials() {
        assert_eq!(
            url_host("https://api.openai.com/v1").as_deref(),
            Some("api.openai.com")
        );
        assert_eq!(
            url_host("http://user:secret@127.0.0.1:8080/v1?x=1").as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(url_host("https:///v1"), None);
    }

    #[test]
    fn the_first_differing_field_is_named() {
        let p = Provenance {
            wmo_e2b: "0.1.0".into(),
            runner: "sha256:r".into(),
            harness: "builtin".into(),
            harness_digest: None,
            environment: "sandbox".into(),
            backend: "local".into(),
            template: None,
            model: "scripted".into(),
            provider_host: None,
            skills: None,
            tasks_file: TasksFile {
                sha256: "sha256:t".into(),
                line: None,
            },
            image: None,
        };
        let same = serde_json::to_value(p.for_line(3)).unwrap();
        assert_eq!(p.mismatch(&same), None);
        let mut other = same.clone();
        other["runner"] = "sha256:older".into();
        other["model"] = "gpt".into();
        assert_eq!(
            p.mismatch(&other),
            Some(("runner", "sha256:older".into(), "sha256:r".into()))
        );
    }
}
