//! Reading control-plane request bodies: a JSON object, its typed fields (`null` counts as
//! absent), and the timeouts they carry, in E2B's range.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::emulator::config::Plan;
use crate::emulator::http::{Request, Response};

/// Default sandbox lifetime when a v1 create omits `timeout` (the infra API's default).
pub(super) const V1_DEFAULT_TIMEOUT: i64 = 15;
/// Default when a v2 create or a connect omits it.
pub(super) const V2_DEFAULT_TIMEOUT: i64 = 300;

/// The body as a JSON object; an empty body is the empty object.
pub(super) fn body_object(req: &Request) -> Result<Map<String, Value>, Response> {
    req.json_object()
}

pub(super) fn present<'a>(body: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    body.get(key).filter(|v| !v.is_null())
}

pub(super) fn int_of(body: &Map<String, Value>, key: &str) -> Result<Option<i64>, Response> {
    typed(body, key, Value::as_i64, "an integer")
}

pub(super) fn bool_of(body: &Map<String, Value>, key: &str) -> Result<Option<bool>, Response> {
    typed(body, key, Value::as_bool, "a boolean")
}

/// A field read by `read`, which says `None` when the value is not `what`.
fn typed<T>(
    body: &Map<String, Value>,
    key: &str,
    read: impl Fn(&Value) -> Option<T>,
    what: &str,
) -> Result<Option<T>, Response> {
    present(body, key)
        .map(|v| read(v).ok_or_else(|| Response::error(400, format!("{key} must be {what}"))))
        .transpose()
}

pub(super) fn string_map(
    body: &Map<String, Value>,
    key: &str,
) -> Result<BTreeMap<String, String>, Response> {
    match present(body, key) {
        None => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(Response::error(400, format!("{key}.{k} must be a string"))),
            })
            .collect(),
        Some(_) => Err(Response::error(
            400,
            format!("{key} must be an object of strings"),
        )),
    }
}

pub(super) fn string_list(obj: &Map<String, Value>, key: &str) -> Result<Vec<String>, Response> {
    let not_strings = || Response::error(400, format!("{key} must be a list of strings"));
    match present(obj, key) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(not_strings))
            .collect(),
        Some(_) => Err(not_strings()),
    }
}

/// A create's or a connect's timeout (`default` when absent), in seconds, within `plan`'s.
pub(super) fn timeout_secs(value: Option<i64>, default: i64, plan: Plan) -> Result<u64, Response> {
    let t = value.unwrap_or(default);
    if t <= 0 {
        return Err(Response::error(
            400,
            "timeout must be a positive number of seconds",
        ));
    }
    if t > plan.max_timeout_secs() {
        return Err(timeout_too_long(plan));
    }
    Ok(t as u64)
}

/// The refusal names the plan's limit, so a client can say which limit applies.
pub(super) fn timeout_too_long(plan: Plan) -> Response {
    Response::error(
        400,
        format!(
            "timeout cannot be greater than {} hours (the {} plan's limit, {} s)",
            plan.max_timeout_secs() / 3600,
            plan.name(),
            plan.max_timeout_secs()
        ),
    )
}
