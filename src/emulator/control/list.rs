//! Listing sandboxes: v1 (all at once) and v2 (filtered by state, template and start time,
//! ordered, and paged with opaque `nextToken` cursors).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::Value;

use super::reply::{listed_json, Answer};
use crate::emulator::http::{query_unescape_strict, Request, Response};
use crate::emulator::state::{SandboxEntry, Shared};
use crate::errors::error_chain;
use crate::sandbox::{Metadata, RunState};

const MAX_PAGE: usize = 100;

/// A sandbox as a list sees it.
type Listed = (Arc<SandboxEntry>, RunState);

/// The deprecated list: running sandboxes only, newest first.
pub(super) fn list_v1(shared: &Shared, req: &Request) -> Answer {
    let filter = metadata_filter(req.query("metadata"))?;
    let mut entries = live_entries(shared)?;
    entries.retain(|(e, state)| *state == RunState::Running && matches(e, &filter));
    entries.sort_by(|(a, _), (b, _)| (b.started, &b.id).cmp(&(a.started, &a.id)));
    Ok(listed(&entries))
}

pub(super) fn list_v2(shared: &Shared, req: &Request) -> Answer {
    let q = ListQuery::read(req)?;
    let mut entries = if q.running || q.paused {
        live_entries(shared)?
    } else {
        Vec::new()
    };
    entries.retain(|(e, state)| {
        let wanted = match state {
            RunState::Running => q.running,
            RunState::Paused => q.paused,
        };
        wanted
            && matches(e, &q.filter)
            && q.started_after.is_none_or(|t| e.started >= t)
            && q.template.is_none_or(|t| e.template == t)
    });
    let total_running = entries
        .iter()
        .filter(|(_, s)| *s == RunState::Running)
        .count();
    entries.sort_by(|(a, _), (b, _)| (a.started, &a.id).cmp(&(b.started, &b.id)));
    if !q.ascending {
        entries.reverse();
    }
    if let Some((t, id)) = &q.cursor {
        entries.retain(|(e, _)| {
            let key = (e.started, &e.id);
            if q.ascending {
                key > (*t, id)
            } else {
                key < (*t, id)
            }
        });
    }
    let more = entries.len() > q.limit;
    entries.truncate(q.limit);
    let mut resp = listed(&entries);
    if q.running {
        resp = resp.with_header("X-Total-Running", total_running.to_string());
    }
    if more {
        if let Some((last, _)) = entries.last() {
            resp = resp.with_header("X-Next-Token", encode_cursor(last, q.ascending));
        }
    }
    Ok(resp)
}

/// What a v2 list asks for.
struct ListQuery<'a> {
    filter: Metadata,
    /// Which states are asked for.
    running: bool,
    paused: bool,
    limit: usize,
    ascending: bool,
    started_after: Option<SystemTime>,
    template: Option<&'a str>,
    /// The page starts after this sandbox.
    cursor: Option<(SystemTime, String)>,
}

impl ListQuery<'_> {
    fn read(req: &Request) -> Result<ListQuery<'_>, Response> {
        let bad = |what: String| Response::error(400, what);
        let filter = metadata_filter(req.query("metadata"))?;
        // Absent means running and paused.
        let (mut running, mut paused) = (true, true);
        if let Some(states) = req.query("state").filter(|s| !s.is_empty()) {
            (running, paused) = (false, false);
            for s in states.split(',') {
                match s.trim() {
                    "running" => running = true,
                    "paused" => paused = true,
                    other => return Err(bad(format!("invalid state {other:?}"))),
                }
            }
        }
        let limit = match req.query("limit") {
            None => MAX_PAGE,
            Some(l) => match l.parse::<usize>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
                _ => return Err(bad(format!("limit must be between 1 and {MAX_PAGE}"))),
            },
        };
        let ascending = match req.query("order") {
            None | Some("desc") => false,
            Some("asc") => true,
            Some(o) => return Err(bad(format!("invalid order {o:?}"))),
        };
        let started_after = match req.query("startedAfter") {
            None => None,
            Some(t) => {
                Some(parse_rfc3339(t).ok_or_else(|| bad(format!("invalid startedAfter {t:?}")))?)
            }
        };
        let template = req.query("template").filter(|t| !t.is_empty());
        let cursor = match req.query("nextToken").filter(|t| !t.is_empty()) {
            None => None,
            Some(t) => {
                Some(decode_cursor(t, ascending).ok_or_else(|| bad("invalid nextToken".into()))?)
            }
        };
        Ok(ListQuery {
            filter,
            running,
            paused,
            limit,
            ascending,
            started_after,
            template,
            cursor,
        })
    }
}

fn listed(entries: &[Listed]) -> Response {
    Response::json(
        200,
        &Value::Array(entries.iter().map(|(e, s)| listed_json(e, *s)).collect()),
    )
}

/// Live sandboxes of this emulator, each with the metadata it was created with.
fn live_entries(shared: &Shared) -> Result<Vec<Listed>, Response> {
    shared
        .live_entries()
        .map_err(|e| Response::error(500, format!("cannot list sandboxes: {}", error_chain(&e))))
}

/// Decodes the `metadata` query value the way the API does: the value (already
/// query-decoded once) is unescaped again as a whole, split into `k=v` pairs on `&`, and each
/// key and value unescaped once more.
fn metadata_filter(raw: Option<&str>) -> Result<Metadata, Response> {
    let mut filter = Metadata::new();
    let Some(raw) = raw.filter(|r| !r.is_empty()) else {
        return Ok(filter);
    };
    let bad = || Response::error(400, format!("invalid metadata filter {raw:?}"));
    let whole = query_unescape_strict(raw).ok_or_else(bad)?;
    for pair in whole.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(bad)?;
        let k = query_unescape_strict(k).ok_or_else(bad)?;
        let v = query_unescape_strict(v).ok_or_else(bad)?;
        filter.insert(k, v);
    }
    Ok(filter)
}

fn matches(e: &SandboxEntry, filter: &Metadata) -> bool {
    filter.iter().all(|(k, v)| e.metadata.get(k) == Some(v))
}

/// Where a page starts: after the item with this key, in this order.
fn encode_cursor(e: &SandboxEntry, ascending: bool) -> String {
    let nanos = e
        .started
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let order = if ascending { "asc" } else { "desc" };
    URL_SAFE_NO_PAD.encode(format!("{nanos}__{}__{order}", e.id))
}

fn decode_cursor(token: &str, ascending: bool) -> Option<(SystemTime, String)> {
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(token.trim_end_matches('=')).ok()?).ok()?;
    let mut parts = text.split("__");
    let nanos: u128 = parts.next()?.parse().ok()?;
    let id = parts.next()?.to_string();
    let order = parts.next()?;
    if parts.next().is_some() || (order == "asc") != ascending {
        return None;
    }
    let nanos = u64::try_from(nanos).ok()?;
    Some((UNIX_EPOCH + Duration::from_nanos(nanos), id))
}

/// Parses RFC 3339 date-times with any offset (`Z`, `+02:00`), as the SDK sends them.
fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    crate::civil::parse_rfc3339(s)
}

#[cfg(test)]
mod tests {
    use super::super::reply::rfc3339;
    use super::*;

    #[test]
    fn rfc3339_round_trips_and_takes_offsets() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t));
        let utc = parse_rfc3339("2024-02-29T12:00:00Z").unwrap();
        assert_eq!(parse_rfc3339("2024-02-29T14:00:00+02:00"), Some(utc));
        assert_eq!(parse_rfc3339("2024-02-29T11:30:00.000000-00:30"), Some(utc));
        assert_eq!(
            utc.duration_since(UNIX_EPOCH).unwrap().as_secs(),
            1_709_208_000
        );
        for bad in [
            "",
            "2024-02-29",
            "2024-13-01T00:00:00Z",
            "2024-02-29T12:00:00+2",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn metadata_filter_decodes_the_sdk_encoding() {
        // What the Python SDK sends for {"pool": "eval", "a b": "x&y"}, once query-decoded.
        let f = metadata_filter(Some("pool=eval&a%2520b=x%2526y")).unwrap();
        assert_eq!(f.get("pool").map(String::as_str), Some("eval"));
        assert_eq!(f.get("a b").map(String::as_str), Some("x&y"));
        assert!(metadata_filter(Some("novalue")).is_err());
        assert!(metadata_filter(None).unwrap().is_empty());
    }
}
