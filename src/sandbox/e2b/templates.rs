//! Templates made from task images: one per image and steps, named by their digest, built
//! once through the API and recorded on this machine, so a later run (or another task on the
//! same image) finds it instead of building it again.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::api::{Api, TemplateBuild};
use super::config::E2bConfig;
use crate::sandbox::{ErrorClass, Result, SandboxError};

/// Between two looks at a running build.
const POLL: Duration = Duration::from_secs(1);
/// Beyond the build's own bound, for another run's uploads and record.
const LOCK_SLACK: Duration = Duration::from_secs(5 * 60);
/// A record is a few hundred bytes.
const MAX_RECORD: u64 = 1 << 20;
/// E2B's uid of `user`, who runs a task's commands and must own its working directory.
pub const E2B_USER_ID: u32 = 1000;

/// What a task's template is made of.
#[derive(Clone)]
pub struct TemplateSource<'a> {
    /// The image, pinned by digest (`reference@sha256:...`).
    pub from_image: &'a str,
    /// The image's working directory: where the task works, made E2B's `user`'s.
    pub workdir: Option<&'a str>,
    /// The build's bound.
    pub timeout: Duration,
    /// Build records, `<name>.json`.
    pub records: &'a Path,
    /// The build's log, `<name>.log`.
    pub log_dir: &'a Path,
    /// The template's steps (`TemplateStep`s: `RUN`, `COPY`, `ENV`, `WORKDIR`, `USER`), in
    /// order; the step that gives the working directory to `user` follows them.
    pub steps: &'a [Value],
    /// The archives the `COPY` steps name by `filesHash`.
    pub uploads: &'a [Upload<'a>],
}

/// An archive a template's `COPY` step copies from.
pub struct Upload<'a> {
    /// sha256 hex of the content: the step's `filesHash`.
    pub hash: &'a str,
    /// The gzipped tar, made only when a build needs it.
    pub archive: &'a dyn Fn() -> std::result::Result<Vec<u8>, String>,
}

/// What `<records>/<name>.json` holds: a build that finished, on which API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    name: String,
    api: String,
    template_id: String,
    build_id: String,
    from_image: String,
    /// Seconds since the Unix epoch.
    built_at: u64,
}

/// The template `source` is made into: found by its record, else built; its name.
pub(super) fn ensure(api: &Api, config: &E2bConfig, source: &TemplateSource) -> Result<String> {
    let body = build_body(source);
    let name = template_name(&body);
    let record_path = source.records.join(format!("{name}.json"));
    let found = || -> Result<bool> {
        let recorded =
            read_record(&record_path).filter(|r| r.api == config.api_base && r.name == name);
        Ok(recorded.is_some() && api.template_exists(&name)?)
    };
    if found()? {
        return Ok(name);
    }
    // Runs on this machine that want the same template build it once: the first builds, the
    // others wait for its record.
    let _building = lock_build(source, &name)?;
    if found()? {
        return Ok(name);
    }
    let log_path = source.log_dir.join(format!("{name}.log"));
    let build = api.request_build(&name)?;
    for upload in source.uploads {
        let archive = (upload.archive)().map_err(|why| SandboxError::Remote {
            class: ErrorClass::BadRequest,
            message: format!("the files of template {name}: {why}"),
            source: None,
        })?;
        api.upload_files(&build, upload.hash, &archive)?;
    }
    api.start_build(&build, &body)?;
    wait_ready(api, &build, &name, source, &log_path)?;
    let record = Record {
        name: name.clone(),
        api: config.api_base.clone(),
        template_id: build.template_id.clone(),
        build_id: build.build_id.clone(),
        from_image: source.from_image.to_string(),
        built_at: crate::image::store::unix_now(),
    };
    write_record(&record_path, &record).map_err(|e| io_error(&record_path, e))?;
    Ok(name)
}

/// `TemplateBuildStartV2`: the image, its steps, then the working directory made `user`'s.
fn build_body(source: &TemplateSource) -> Value {
    let mut steps = source.steps.to_vec();
    if let Some(dir) = source.workdir.filter(|d| d.starts_with('/') && *d != "/") {
        let dir = crate::sandbox::shell_quote(dir);
        let own = format!("mkdir -p {dir} && chown -R {E2B_USER_ID}:{E2B_USER_ID} {dir}");
        steps.push(json!({"type": "RUN", "args": [own, "root"], "force": false}));
    }
    json!({"fromImage": source.from_image, "steps": steps, "force": false})
}

/// Named by what it is made of: the same image and steps are one template.
fn template_name(body: &Value) -> String {
    // serde_json's maps keep keys sorted, so the text is one for one content.
    let digest = crate::digest::sha256_hex(body.to_string().as_bytes());
    format!("wmo-e2b-{}", &digest[..20])
}

/// Polls until the build is ready, its log entries appended to `log_path`.
fn wait_ready(
    api: &Api,
    build: &TemplateBuild,
    name: &str,
    source: &TemplateSource,
    log_path: &Path,
) -> Result<()> {
    fs::create_dir_all(source.log_dir).map_err(|e| io_error(source.log_dir, e))?;
    let mut log = File::create(log_path).map_err(|e| io_error(log_path, e))?;
    let deadline = Instant::now() + source.timeout;
    let mut offset = 0;
    loop {
        let status = api.build_status(build, offset)?;
        offset += status.log_entries.len();
        for entry in &status.log_entries {
            let _ = writeln!(log, "{}", entry.message);
        }
        let failed = |why: String| SandboxError::Remote {
            class: ErrorClass::BadRequest,
            message: format!(
                "the template {name} of {} did not build: {why} (log: {})",
                source.from_image,
                log_path.display()
            ),
            source: None,
        };
        match status.status.as_str() {
            "ready" => return Ok(()),
            "error" => {
                let reason = status.reason.map(|r| r.message).unwrap_or_default();
                return Err(failed(reason));
            }
            _ if Instant::now() >= deadline => {
                return Err(failed(format!(
                    "still building after {} s",
                    source.timeout.as_secs()
                )))
            }
            _ => std::thread::sleep(POLL),
        }
    }
}

/// Held while `name` is built; waited for as long as another run's build may take.
fn lock_build(source: &TemplateSource, name: &str) -> Result<File> {
    let path = source.records.join(format!("{name}.lock"));
    fs::create_dir_all(source.records).map_err(|e| io_error(source.records, e))?;
    let wait = source.timeout + LOCK_SLACK;
    match crate::sync::flock_within(&path, libc::LOCK_EX, wait) {
        Ok(Some(file)) => Ok(file),
        Ok(None) => Err(SandboxError::Remote {
            class: ErrorClass::Capacity,
            message: format!(
                "another run on this machine has been building the template {name} for more \
                 than {} s (it holds {})",
                wait.as_secs(),
                path.display()
            ),
            source: None,
        }),
        Err(e) => Err(io_error(&path, e)),
    }
}

fn read_record(path: &Path) -> Option<Record> {
    let mut bytes = Vec::new();
    File::open(path)
        .ok()?
        .take(MAX_RECORD)
        .read_to_end(&mut bytes)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Whole or absent (see [`crate::state::write_whole`]).
fn write_record(path: &Path, record: &Record) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    crate::state::write_whole(path, &serde_json::to_vec_pretty(record)?)
}

fn io_error(path: &Path, source: std::io::Error) -> SandboxError {
    SandboxError::Io {
        id: String::new(),
        what: format!("the template record {}", PathBuf::from(path).display()),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source<'a>(from_image: &'a str, workdir: Option<&'a str>) -> TemplateSource<'a> {
        TemplateSource {
            from_image,
            workdir,
            timeout: Duration::from_secs(1),
            records: Path::new("records"),
            log_dir: Path::new("logs"),
            steps: &[],
            uploads: &[],
        }
    }

    #[test]
    fn a_template_is_named_by_its_content() {
        let a = template_name(&build_body(&source("r/a@sha256:1", Some("/app"))));
        let again = template_name(&build_body(&source("r/a@sha256:1", Some("/app"))));
        let other_image = template_name(&build_body(&source("r/a@sha256:2", Some("/app"))));
        let other_dir = template_name(&build_body(&source("r/a@sha256:1", Some("/src"))));
        assert_eq!(a, again);
        assert_ne!(a, other_image);
        assert_ne!(a, other_dir);
        assert!(a.starts_with("wmo-e2b-") && a.len() == "wmo-e2b-".len() + 20);
    }

    #[test]
    fn the_working_directory_is_made_the_task_users() {
        let body = build_body(&source("r/a@sha256:1", Some("/my app")));
        assert_eq!(
            body["steps"][0]["args"],
            json!(["mkdir -p '/my app' && chown -R 1000:1000 '/my app'", "root"])
        );
        let none = build_body(&source("r/a@sha256:1", None));
        assert_eq!(none["steps"], json!([]));
        assert_eq!(none["fromImage"], "r/a@sha256:1");
    }

    #[test]
    fn steps_come_before_the_working_directory_and_name_the_template_too() {
        let copy = |hash: &str| json!({"type": "COPY", "args": ["a/*", "/opt/a", "", ""], "filesHash": hash});
        let (one, two) = ([copy("11")], [copy("22")]);
        let with = |steps| TemplateSource {
            steps,
            ..source("r/a@sha256:1", Some("/app"))
        };
        let body = build_body(&with(&one));
        assert_eq!(body["steps"][0]["filesHash"], "11");
        assert_eq!(body["steps"][1]["type"], "RUN");
        assert_ne!(
            template_name(&body),
            template_name(&build_body(&with(&two)))
        );
    }
}
