//! Template builds through E2B's API (`shared/docs/e2b-wire.md`, "Template builds"): ask for
//! a build of a name, upload a step's files to the URL handed out, start it with its steps,
//! poll its status; and whether a name is taken.

use serde::Deserialize;
use serde_json::{json, Value};
use ureq::Agent;

use super::{expect, status_failure, Api};
use crate::sandbox::e2b::error::ApiOp;
use crate::sandbox::{ErrorClass, Result, SandboxError};

const OP: ApiOp = ApiOp::Template;

/// A build asked for: the template it is of and its own id.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TemplateBuild {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
}

/// Where a build is, with the log entries past the offset asked for.
#[derive(Debug, Clone, Deserialize)]
pub struct BuildStatus {
    pub status: String,
    #[serde(rename = "logEntries", default)]
    pub log_entries: Vec<LogEntry>,
    #[serde(default)]
    pub reason: Option<Reason>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct LogEntry {
    #[serde(default)]
    pub message: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Reason {
    #[serde(default)]
    pub message: String,
}

#[derive(Deserialize)]
struct UploadLink {
    present: bool,
    #[serde(default)]
    url: Option<String>,
}

impl Api {
    /// Whether a template answers to `name` (E2B: 200, or 403 when another team owns it).
    pub fn template_exists(&self, name: &str) -> Result<bool> {
        let path = format!("/templates/aliases/{name}");
        let resp = self.call(OP, None, Agent::get, &path)?;
        match resp.status().as_u16() {
            200 | 403 => Ok(true),
            404 => Ok(false),
            _ => Err(status_failure(OP, None, resp)),
        }
    }

    /// Asks for a new build of the template `name`.
    pub fn request_build(&self, name: &str) -> Result<TemplateBuild> {
        let resp = self.call_json(
            OP,
            None,
            Agent::post,
            "/v3/templates",
            &json!({"name": name}),
        )?;
        let resp = expect(OP, None, resp, &[200, 201, 202])?;
        self.json(OP, None, resp)
    }

    /// Uploads a `COPY` step's archive (`files_hash` names it) unless the template has it.
    pub fn upload_files(
        &self,
        build: &TemplateBuild,
        files_hash: &str,
        archive: &[u8],
    ) -> Result<()> {
        let path = format!("/templates/{}/files/{files_hash}", build.template_id);
        let resp = self.call(OP, None, Agent::get, &path)?;
        let resp = expect(OP, None, resp, &[200, 201])?;
        let link: UploadLink = self.json(OP, None, resp)?;
        let url = match (link.present, link.url) {
            (true, _) => return Ok(()),
            (false, Some(url)) => url,
            (false, None) => {
                return Err(SandboxError::Remote {
                    class: ErrorClass::Transport,
                    message: format!("{}: the upload link has no URL", OP.describe()),
                    source: None,
                })
            }
        };
        // A presigned URL: the API key does not go with it.
        let resp = self.send(OP, None, |a, _key| a.put(&url).send(archive))?;
        if !resp.status().is_success() {
            return Err(status_failure(OP, None, resp));
        }
        Ok(())
    }

    /// Starts `build` with `body` (`TemplateBuildStartV2`: `fromImage`, `steps`, ...).
    pub fn start_build(&self, build: &TemplateBuild, body: &Value) -> Result<()> {
        let path = format!(
            "/v2/templates/{}/builds/{}",
            build.template_id, build.build_id
        );
        let resp = self.call_json(OP, None, Agent::post, &path, body)?;
        expect(OP, None, resp, &[200, 201, 202]).map(drop)
    }

    /// The build's status and its log entries from `offset` on.
    pub fn build_status(&self, build: &TemplateBuild, offset: usize) -> Result<BuildStatus> {
        let path = format!(
            "/templates/{}/builds/{}/status?logsOffset={offset}",
            build.template_id, build.build_id
        );
        let resp = self.call(OP, None, Agent::get, &path)?;
        let resp = expect(OP, None, resp, &[200])?;
        self.json(OP, None, resp)
    }
}
