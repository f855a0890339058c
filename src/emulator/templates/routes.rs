//! The template endpoints, shaped as E2B's API answers them (`shared/docs/e2b-wire.md`,
//! "Template builds"), and the upload URL the API hands out for a `COPY` step's files.

use std::fs;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::recipe::{is_files_hash, read_steps, Recipe, Step};
use super::{build, LogEntry, Status, Templates, BASE_IMAGE};
use crate::emulator::config::BASE_TEMPLATE;
use crate::emulator::http::{Request, Response};
use crate::emulator::state::{constant_time_eq, Shared};
use crate::sync::lock;

/// Where uploads go: `/_emulator/template-files/<hash>?signature=...`.
const UPLOAD_PATH: [&str; 2] = ["_emulator", "template-files"];
/// Log entries one status call returns, as E2B's `limit` allows.
const MAX_LOG_PAGE: usize = 100;
/// A template name, as E2B bounds it.
const MAX_NAME: usize = 128;

/// Whether `req` is an upload, which carries its URL's signature instead of the API key.
pub(in crate::emulator) fn is_upload(req: &Request) -> bool {
    req.method == "PUT" && segments(req).starts_with(&UPLOAD_PATH)
}

/// The answer to a template request; `None` when `req` is not one.
pub(in crate::emulator) fn handle(shared: &Shared, req: &Request) -> Option<Response> {
    let t = &shared.templates;
    let segments = segments(req);
    let keyed = req
        .header("x-api-key")
        .is_some_and(|k| shared.api_key_matches(k));
    if !keyed && !is_upload(req) && is_template_path(&segments) {
        return Some(Response::error(401, "Invalid API key"));
    }
    let resp = match (req.method.as_str(), segments.as_slice()) {
        ("POST", ["v3", "templates"]) => request_build(t, req),
        ("GET", ["templates", "aliases", name]) => alias(shared, name),
        ("GET", ["templates", id, "files", hash]) => upload_link(t, req, id, hash),
        ("PUT", ["_emulator", "template-files", hash]) => upload(t, req, hash),
        ("POST", ["v2", "templates", id, "builds", build]) => start(t, req, id, build),
        ("GET", ["templates", id, "builds", build, "status"]) => status(t, req, id, build),
        ("POST", ["templates", "tags"]) => assign_tags(t, req),
        ("DELETE", ["templates", "tags"]) => remove_tags(t, req),
        ("GET", ["templates", id, "tags"]) => match t.tags_of(id) {
            Some(tags) => Response::json(
                200,
                &Value::from(
                    tags.into_iter()
                        .map(|(tag, build, at)| {
                            json!({"tag": tag, "buildID": build, "createdAt": humantime::format_rfc3339_millis(at).to_string()})
                        })
                        .collect::<Vec<_>>(),
                ),
            ),
            None => not_found(id),
        },
        ("DELETE", ["templates", id]) => match t.delete(id) {
            true => Response::empty(204),
            false => not_found(id),
        },
        _ => return None,
    };
    Some(resp)
}

/// The paths this module serves (uploads aside, which carry a signature instead of the key).
fn is_template_path(segments: &[&str]) -> bool {
    matches!(
        segments,
        ["templates", ..] | ["v2", "templates", ..] | ["v3", "templates", ..]
    )
}

fn segments(req: &Request) -> Vec<&str> {
    req.path.split('/').filter(|s| !s.is_empty()).collect()
}

fn assign_tags(t: &Templates, req: &Request) -> Response {
    let (target, tags) = match req
        .json_object()
        .and_then(|b| Ok((text(&b, "target")?, tag_list(&b)?)))
    {
        Ok(read) => read,
        Err(resp) => return resp,
    };
    match t.assign_tags(&target, &tags) {
        Some(build) => Response::json(201, &json!({"buildID": build, "tags": tags})),
        None => not_found(&target),
    }
}

fn remove_tags(t: &Templates, req: &Request) -> Response {
    let (name, tags) = match req
        .json_object()
        .and_then(|b| Ok((text(&b, "name")?, tag_list(&b)?)))
    {
        Ok(read) => read,
        Err(resp) => return resp,
    };
    match t.remove_tags(&name, &tags) {
        true => Response::empty(204),
        false => not_found(&name),
    }
}

fn text(body: &Map<String, Value>, key: &str) -> Result<String, Response> {
    body.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| Response::error(400, format!("{key} must be a string")))
}

/// `tags`: a list of names, each one a tag may be.
fn tag_list(body: &Map<String, Value>) -> Result<Vec<String>, Response> {
    let bad = || Response::error(400, "tags must be a list of tag names");
    let tags: Vec<String> = match body.get("tags") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(bad)?,
        Some(_) => return Err(bad()),
    };
    match tags.iter().all(|t| valid_name(t) && !t.contains('/')) {
        true => Ok(tags),
        false => Err(bad()),
    }
}

/// A template name or tag as E2B takes it: bounded, of a safe alphabet.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
}

fn request_build(t: &Templates, req: &Request) -> Response {
    let body = match req.json_object() {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let Some(full) = body
        .get("name")
        .or_else(|| body.get("alias"))
        .and_then(Value::as_str)
    else {
        return Response::error(400, "name is required");
    };
    let (name, tag) = match full.split_once(':') {
        Some((n, tag)) => (n, Some(tag)),
        None => (full, None),
    };
    let mut tags = match tag_list(&body) {
        Ok(tags) => tags,
        Err(resp) => return resp,
    };
    tags.extend(tag.map(str::to_string));
    if !valid_name(name) || name == BASE_TEMPLATE {
        return Response::error(400, format!("{name:?} cannot be a template's name"));
    }
    if let Some(bad) = tags.iter().find(|t| !valid_name(t) || t.contains('/')) {
        return Response::error(400, format!("{bad:?} cannot be a tag"));
    }
    match t.request(name, &tags) {
        Ok((name, build)) => {
            let tags: Vec<String> = if tags.is_empty() {
                vec!["default".into()]
            } else {
                tags
            };
            Response::json(
                202,
                &json!({
                    "templateID": build.template_id,
                    "buildID": build.id,
                    "public": false,
                    "names": [name],
                    "aliases": [name],
                    "tags": tags,
                }),
            )
        }
        Err(why) => Response::error(429, why),
    }
}

/// 200 for a template this emulator serves (its own builds, `base`, `--template` names);
/// 404 when the name is free, which is how the SDK's `Template.exists` reads it.
fn alias(shared: &Shared, name: &str) -> Response {
    let id = if name == BASE_TEMPLATE || shared.config.templates.iter().any(|t| t == name) {
        Some(name.to_string())
    } else {
        shared.templates.id_of(name)
    };
    match id {
        Some(id) => Response::json(200, &json!({"templateID": id, "public": false})),
        None => not_found(name),
    }
}

fn upload_link(t: &Templates, req: &Request, id: &str, hash: &str) -> Response {
    if !t.exists(id) {
        return not_found(id);
    }
    if !is_files_hash(hash) {
        return Response::error(400, "the files hash must be a sha256 in hex");
    }
    let present = t.files.join(hash).is_file();
    let host = req.header("host").unwrap_or("127.0.0.1");
    let url = format!(
        "http://{host}/{}/{}/{hash}?signature={}",
        UPLOAD_PATH[0],
        UPLOAD_PATH[1],
        signature(t, hash)
    );
    Response::json(201, &json!({"present": present, "url": url}))
}

fn upload(t: &Templates, req: &Request, hash: &str) -> Response {
    let signed = req
        .query("signature")
        .is_some_and(|s| constant_time_eq(s.as_bytes(), signature(t, hash).as_bytes()));
    if !is_files_hash(hash) || !signed {
        // As a presigned URL that does not match: the store refuses it, naming nothing.
        return Response::error(403, "the upload URL's signature does not match");
    }
    let path = t.files.join(hash);
    let kept =
        fs::create_dir_all(&t.files).and_then(|()| crate::state::write_whole(&path, &req.body));
    match kept {
        Ok(()) => Response::empty(200),
        Err(e) => Response::error(500, format!("cannot keep the upload: {e}")),
    }
}

/// Signs an upload URL with the emulator's secret, so only the API's answer grants one.
fn signature(t: &Templates, hash: &str) -> String {
    crate::digest::sha256_hex(format!("{}:{hash}", t.secret).as_bytes())
}

fn start(t: &Arc<Templates>, req: &Request, id: &str, build_id: &str) -> Response {
    let Some(build) = t.build(id, build_id) else {
        return not_found(&format!("{id}/{build_id}"));
    };
    let body = match req.json_object() {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    if lock(&build.state).status != Status::Waiting {
        return Response::error(409, "this build has already been started");
    }
    let steps = match read_steps(&body) {
        Ok(steps) => steps,
        Err(e) => return Response::error(400, e.to_string()),
    };
    let Some(slot) = t.slot() else {
        return Response::error(
            429,
            format!(
                "{} template builds are running, the most at once (--max-builds): start it \
                 again when one has finished",
                t.max_running
            ),
        );
    };
    match base(t, &body) {
        Ok(recipe) => {
            let recipe = Recipe {
                steps: recipe.steps.into_iter().chain(steps).collect(),
                ..recipe
            };
            build::start(Arc::clone(t), build, recipe, slot);
        }
        Err(why) => lock(&build.state).fail(why),
    }
    Response::empty(202)
}

/// What a build starts from: `fromImage`, or the recipe of the template `fromTemplate`
/// (`base` is made from E2B's base image).
fn base(t: &Templates, body: &Map<String, Value>) -> Result<Recipe, String> {
    if body.get("fromImageRegistry").is_some_and(|v| !v.is_null()) {
        return Err(
            "fromImageRegistry is not served by the wmo-e2b emulator: it pulls with \
                    registries.toml and the Docker config file"
                .into(),
        );
    }
    let image = body.get("fromImage").and_then(Value::as_str);
    let template = body.get("fromTemplate").and_then(Value::as_str);
    let from = |image: &str| Recipe {
        from_image: image.to_string(),
        steps: Vec::<Step>::new(),
    };
    match (image, template) {
        (Some(image), None) => Ok(from(image)),
        (None, Some(BASE_TEMPLATE)) => Ok(from(BASE_IMAGE)),
        (None, Some(name)) => t
            .recipe_of(name)
            .ok_or_else(|| format!("template '{name}' has no finished build to start from")),
        _ => Err("a build starts from one of fromImage and fromTemplate".into()),
    }
}

fn status(t: &Templates, req: &Request, id: &str, build_id: &str) -> Response {
    let Some(build) = t.build(id, build_id) else {
        return not_found(&format!("{id}/{build_id}"));
    };
    let number = |name: &str, default: usize| match req.query(name) {
        None => Some(default),
        Some(v) => v.parse::<usize>().ok(),
    };
    let (Some(offset), Some(limit)) = (number("logsOffset", 0), number("limit", MAX_LOG_PAGE))
    else {
        return Response::error(400, "logsOffset and limit must be non-negative integers");
    };
    let state = lock(&build.state);
    let entries: Vec<Value> = state
        .logs
        .iter()
        .skip(offset)
        .take(limit.min(MAX_LOG_PAGE))
        .map(entry)
        .collect();
    let mut body = json!({
        "templateID": build.template_id,
        "buildID": build.id,
        "status": state.status.as_str(),
        "logs": [],
        "logEntries": entries,
    });
    if let Some(reason) = &state.reason {
        body["reason"] = json!({"message": reason, "logEntries": []});
    }
    Response::json(200, &body)
}

fn entry(e: &LogEntry) -> Value {
    json!({
        "timestamp": humantime::format_rfc3339_millis(e.at).to_string(),
        "level": e.level,
        "message": e.message,
    })
}

fn not_found(what: &str) -> Response {
    Response::error(404, format!("template '{what}' not found"))
}
